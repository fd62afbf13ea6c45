"""A synthetic machine for tuner tests: step time and memory as functions of the config.

Shaped like real measurements: throughput rises with the micro-batch and flattens; each ZeRO
stage trades memory for communication (stage 3 gathers parameters, offload pays a host step);
bucket sizes have a sweet spot (many small buckets cost latency, one big bucket hides nothing);
overlap hides communication behind backward; memory grows with the micro-batch until the
device budget makes the run an ``oom``.
"""

from __future__ import annotations

import math
import random
import zlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

import optuna

from autotune.config import load_config
from autotune.experiment import ExperimentResult, Metrics, Status, Timings
from autotune.profiling.model_info import ModelInfo
from autotune.tuner import Candidate, Tuner

NUM_PARAMS = 20_000_000
ACTIVATION_BYTES_PER_SAMPLE = 40_000_000
MODEL = ModelInfo(
    num_params=NUM_PARAMS,
    param_bytes=4 * NUM_PARAMS,
    activation_bytes_per_sample=ACTIVATION_BYTES_PER_SAMPLE,
    flops_per_sample=6 * NUM_PARAMS * 512,
)
STAGE_COMM_S = {0: 0.05, 1: 0.05, 2: 0.055, 3: 0.09}
STATE_BYTES_PER_PARAM = {0: 16, 1: 12, 2: 10, 3: 8}  # fp32 + Adam on 2 ranks


@dataclass
class Landscape:
    """Deterministic (given ``seed``) metrics for a concrete ds_config on 2 ranks.

    Args:
        budget_bytes: the per-rank device memory; above it a run is ``oom``.
        noise: relative standard deviation of measured step times.
        seed: seeds the noise; the same name and seed always measure the same.
        duration_s: what each experiment reports as its wall time (its start-up, with
            ``seconds_per_sample``).
        seconds_per_sample: training time per sample of the micro-batch, which each
            experiment reports as its warm-up and window and adds to its wall time.
    """

    budget_bytes: int = 1_500_000_000
    noise: float = 0.0
    seed: int = 0
    duration_s: float = 10.0
    world_size: int = 2
    seconds_per_sample: float = 0.0

    def step_time_s(self, ds_config: Mapping[str, Any]) -> float:
        """Noise-free seconds per optimizer step."""
        config = load_config(ds_config, self.world_size)
        zero = config.zero_optimization
        mbs, gas = config.train_micro_batch_size_per_gpu, config.gradient_accumulation_steps
        assert isinstance(mbs, int) and isinstance(gas, int)
        compute = 0.02 + 0.01 * mbs
        if zero.stage >= 2 and not zero.contiguous_gradients:
            compute *= 1.04  # gradients copied into place
        comm = STAGE_COMM_S[zero.stage]
        if zero.stage == 2 and zero.reduce_scatter:
            comm *= 0.9
        if zero.stage == 3:
            comm += _stage3_overhead_s(zero.model_dump())
            hidden = 0.5 * _share(zero.stage3_prefetch_bucket_size)
        else:
            share = _share(zero.reduce_bucket_size)
            comm += 0.002 / share  # latency per bucket
            if zero.stage > 0:
                comm += 0.001 / _share(zero.allgather_bucket_size)
            # Overlap hides a bucket's all-reduce behind the rest of backward, but not the last.
            hidden = (1.0 - share) * 0.8 if zero.overlap_comm is True else 0.0
        exposed = comm - min(comm * hidden, 0.7 * compute)
        host_step = 0.12 if zero.optimizer_offload_device.value == "cpu" else 0.0
        return gas * compute + exposed + host_step

    def peak_bytes(self, ds_config: Mapping[str, Any]) -> int:
        config = load_config(ds_config, self.world_size)
        zero = config.zero_optimization
        mbs = config.train_micro_batch_size_per_gpu
        assert isinstance(mbs, int)
        per_param = STATE_BYTES_PER_PARAM[zero.stage]
        if zero.optimizer_offload_device.value == "cpu":
            per_param = 8 if zero.stage < 3 else 4
        buckets = 4 * min(_elements(zero.reduce_bucket_size), NUM_PARAMS)
        if zero.stage == 3:
            buckets = 4 * min(_elements(zero.stage3_prefetch_bucket_size), NUM_PARAMS)
        return per_param * NUM_PARAMS + ACTIVATION_BYTES_PER_SAMPLE * mbs + buckets

    def throughput(self, ds_config: Mapping[str, Any]) -> float:
        """Noise-free samples per second."""
        config = load_config(ds_config, self.world_size)
        assert isinstance(config.train_batch_size, int)
        return config.train_batch_size / self.step_time_s(ds_config)

    def run(self, candidate: Candidate) -> ExperimentResult:
        """What a runner would return for ``candidate``."""
        mbs = load_config(candidate.ds_config, self.world_size).train_micro_batch_size_per_gpu
        assert isinstance(mbs, int)
        training_s = self.seconds_per_sample * mbs
        timings = Timings(
            warmup_s=training_s / 2, window_s=training_s / 2, total_s=self.duration_s + training_s
        )
        peak = self.peak_bytes(candidate.ds_config)
        if peak > self.budget_bytes:
            return ExperimentResult(
                candidate.name, Status.oom, error="OutOfMemoryError", timings=timings
            )
        step = self.step_time_s(candidate.ds_config)
        rng = random.Random(zlib.crc32(f"{self.seed}/{candidate.name}".encode()))
        steps = [step * math.exp(rng.gauss(0.0, self.noise)) for _ in range(3)]
        tbs = load_config(candidate.ds_config, self.world_size).train_batch_size
        assert isinstance(tbs, int)
        metrics = Metrics.from_window(steps, tbs, MODEL.flops_per_sample * tbs, peak)
        return ExperimentResult(candidate.name, Status.ok, metrics, timings=timings)


def _share(elements: Any) -> float:
    """The share of the model in one bucket of ``elements``."""
    return min(_elements(elements), NUM_PARAMS) / NUM_PARAMS


def _elements(value: Any) -> int:
    return int(value) if isinstance(value, int | float) else 500_000_000


def _stage3_overhead_s(zero: Mapping[str, Any]) -> float:
    """Small persistence thresholds gather many tiny tensors; a low live limit re-gathers."""
    threshold = zero["stage3_param_persistence_threshold"]
    live = _share(zero["stage3_max_live_parameters"])
    return 0.01 * abs(math.log10(threshold) - 5) + 0.03 * (1 - live)


def drive(
    tuner: Any, landscape: Landscape, clock: Any = None, limit: int = 10_000
) -> list[Candidate]:
    """Run the tuner against the landscape to the end; the candidates in the order asked."""
    asked: list[Candidate] = []
    while (candidate := tuner.ask()) is not None:
        asked.append(candidate)
        result = landscape.run(candidate)
        if clock is not None:
            clock.advance(result.timings.total_s)
        tuner.tell(result)
        assert len(asked) < limit
    return asked


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@dataclass
class CutOff:
    """A run killed with experiments in flight: what tune() finds in the results directory."""

    proposed: list[str]  # every name asked, in that order
    finished: dict[str, ExperimentResult]  # in the order they finished (the log)
    in_flight: dict[str, Candidate]  # started, never finished
    record: optuna.Study | None = None  # the study as the kill left it

    def resumed(self, make: Callable[..., Tuner], *args: Any, **kwargs: Any) -> Tuner:
        """A tuner resumed from the record the kill left (``make(*args, study=..., **kwargs)``)."""
        assert self.record is not None
        return make(*args, study=snapshot(self.record), **kwargs)


def snapshot(study: optuna.Study) -> optuna.Study:
    """A copy of ``study`` in a storage of its own, running trials included: what a results
    directory holds after its run was killed."""
    copy = optuna.create_study(direction=study.direction, sampler=study.sampler)
    for trial in study.get_trials(deepcopy=True):
        copy.add_trial(trial)
    return copy


def run_until_killed(
    tuner: Tuner,
    landscape: Landscape,
    interrupt_after: int,
    seed: int,
    tell: Callable[[Tuner, ExperimentResult], None] = Tuner.tell,
    slots: int = 3,
) -> CutOff:
    """Keep ``slots`` in flight, finishing them in a seeded random order, until
    ``interrupt_after`` have finished."""
    finish_order = random.Random(seed)
    cut_off = CutOff([], {}, {})
    while len(cut_off.finished) < interrupt_after:
        while len(cut_off.in_flight) < slots and (candidate := tuner.ask()) is not None:
            cut_off.proposed.append(candidate.name)
            cut_off.in_flight[candidate.name] = candidate
        done = cut_off.in_flight.pop(finish_order.choice(sorted(cut_off.in_flight)))
        cut_off.finished[done.name] = landscape.run(done)
        tell(tuner, cut_off.finished[done.name])
    cut_off.record = snapshot(tuner.study)
    return cut_off


def true_largest_fit(landscape: Landscape, stage: int, cap: int = 1024) -> int:
    def config(size: int) -> dict[str, object]:
        return {
            "zero_optimization": {"stage": stage},
            "train_micro_batch_size_per_gpu": size,
            "gradient_accumulation_steps": 1,
        }

    return max(
        s for s in range(1, cap + 1) if landscape.peak_bytes(config(s)) <= landscape.budget_bytes
    )


@dataclass
class Tied(Landscape):
    """Every configuration equally fast, each window's steps spread ±20%: the machine's
    noise is plain to see, and no measurement can say which configuration is best, so a
    leader of one measurement stays in doubt."""

    def run(self, candidate: Candidate) -> ExperimentResult:
        result = super().run(candidate)
        if result.metrics is None:
            return result
        tbs = result.metrics.train_batch_size
        steps = [tbs / 100 * factor for factor in (1.2, 1.0, 1 / 1.2)]
        metrics = Metrics.from_window(steps, tbs, 0.0, result.metrics.peak_memory_bytes)
        return replace(result, metrics=metrics)


@dataclass
class Flat(Landscape):
    """Every configuration equally fast but for the noise: which is best is the draw's."""

    def step_time_s(self, ds_config: Mapping[str, Any]) -> float:
        tbs = load_config(ds_config, self.world_size).train_batch_size
        assert isinstance(tbs, int)
        return tbs / 100
