"""A runner that answers from a measured table: the replay half of a tabular benchmark.

``experiments/landscape.py`` measures every configuration a tuner may ask for, several times,
interleaved, and stores the table (``results/landscapes/*.json``). :class:`TableRunner` then
answers an experiment from it: ``oom`` (or whatever failed) where the table says so, else the
configuration's median throughput times a factor drawn from the table's own noise (every
measurement's ratio to its configuration's median, pooled). Draws are seeded by the runner's
seed and the experiment's name, so a replay is deterministic and a re-measurement (its spec's
``repeat_of`` names the configuration) gets its own draw.
"""

from __future__ import annotations

import json
import random
import re
import statistics
import zlib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from autotune.config import load_config
from autotune.experiment import ExperimentResult, ExperimentSpec, Metrics, Status, Timings
from autotune.job import TuningJob, experiment_spec
from autotune.profiling.model_info import ModelInfo
from autotune.tuner import Tuner
from autotune.tuner.hardware import CATALOG
from autotune.tuner.ranking import Ranked
from autotune.tuner.warm_start import WarmStart

LANDSCAPE_FORMAT = 1
# The benchmark's line: a tuner's choice counts when within 2% of the table's best.
WITHIN = 0.98
_SIZE = re.compile(r"_mbs(?P<size>\d+)")


def tuning_config(
    stages: list[int],
    max_micro_batch: int,
    num_micro_batches: int = 2,
    start_profile_step: int = 2,
    end_profile_step: int = 4,
) -> dict[str, Any]:
    """The config a landscape is measured under and its replays tune (``fast: false``)."""
    return {
        "optimizer": {"type": "AdamW", "params": {"lr": 3e-4, "betas": [0.9, 0.95]}},
        "gradient_clipping": 1.0,
        "zero_optimization": {"stage": stages},
        "autotuning": {
            "enabled": True,
            "metric": "throughput",
            "fast": False,
            "start_profile_step": start_profile_step,
            "end_profile_step": end_profile_step,
            "max_train_micro_batch_size_per_gpu": max_micro_batch,
            "num_tuning_micro_batch_sizes": num_micro_batches,
            "tuner_early_stopping": 10,
            "tuner_num_trials": 60,
            "num_remeasure": 2,
        },
    }


def measured_configs(table: Mapping[str, Any]) -> list[Ranked]:
    """The table's configurations that ran ok, each with its measurements (throughput), best
    median first.

    Example:
        >>> table = {"configs": {"a": {"status": "ok", "throughput": [9.0, 10.0, 12.0]},
        ...                      "b": {"status": "ok", "throughput": [20.0]},
        ...                      "c": {"status": "oom", "throughput": []}}}
        >>> [(r.name, r.value) for r in measured_configs(table)]
        [('b', 20.0), ('a', 10.0)]
    """
    measured = [
        Ranked(name, statistics.median(entry["throughput"]), tuple(entry["throughput"]), 0)
        for name, entry in table["configs"].items()
        if entry["status"] == "ok" and entry["throughput"]
    ]
    return sorted(measured, key=lambda r: -r.value)


class MissingMeasurement(KeyError):
    """The table has no measurement of a configuration a tuner asked for."""


class TableRunner:
    """Answers experiments from a landscape table (see the module docstring).

    Args:
        table: a landscape, as ``experiments/landscape.py`` writes it.
        seed: seeds the noise.

    Example:
        >>> table = {"configs": {"z1_mbs4": {"status": "ok", "throughput": [9.0, 10.0, 11.0],
        ...          "duration_s": [2.0]}, "z1_mbs8": {"status": "oom", "throughput": []}}}
        >>> runner = TableRunner(table, seed=1)
        >>> runner.value("z1_mbs4"), runner.best_value
        (10.0, 10.0)
        >>> spec = ExperimentSpec("z1_mbs8", {}, "gpt", {}, world_size=2, start_profile_step=2,
        ...                       end_profile_step=4, timeout_s=60, seed=0, cpus_per_rank=1)
        >>> runner.run(spec).status.value
        'oom'
    """

    def __init__(self, table: Mapping[str, Any], seed: int = 0) -> None:
        self._configs: Mapping[str, Mapping[str, Any]] = table["configs"]
        self._seed = seed
        self._medians = {
            name: statistics.median(entry["throughput"])
            for name, entry in self._configs.items()
            if entry["status"] == "ok" and entry["throughput"]
        }
        self._noise = [
            value / self._medians[name]
            for name, entry in self._configs.items()
            if name in self._medians and len(entry["throughput"]) > 1
            for value in entry["throughput"]
        ] or [1.0]

    @classmethod
    def load(cls, path: Path | str, seed: int = 0) -> TableRunner:
        return cls(json.loads(Path(path).read_text()), seed)

    @property
    def names(self) -> list[str]:
        """Every configuration the table has (any status)."""
        return list(self._configs)

    @property
    def best_value(self) -> float:
        """The highest median throughput in the table."""
        return max(self._medians.values())

    def value(self, name: str) -> float | None:
        """The median throughput of configuration ``name`` (None if it does not run ok)."""
        return self._lookup(name)[1]

    def _lookup(self, name: str) -> tuple[Mapping[str, Any], float | None]:
        """The table's entry for ``name`` and its median.

        The search for the largest micro-batch may visit a size the measurement did not (it
        follows measured peak memory, which varies a little): memory grows with the
        micro-batch, so a size at or above one that failed fails too, and a size below one
        that ran gets its throughput interpolated (linearly, from the next smaller size that
        ran, or from no throughput at size 0). ``model_based`` may ask for knob values at a
        micro-batch the table measured them at another size only (scaled as the config's own
        knobs scale between the two sizes), or not at all (answered as the config's own).
        """
        base = name
        if base in self._configs:
            return self._configs[base], self._medians.get(base)
        match = _SIZE.search(base)
        if match is None:
            raise MissingMeasurement(f"the landscape has no measurement of {base}")
        size = int(match["size"])
        siblings = self._siblings(base)
        failed = [s for s, other in siblings.items() if s < size and other not in self._medians]
        if failed:
            return self._configs[siblings[max(failed)]], None
        measured = {
            s: self._medians[other] for s, other in siblings.items() if other in self._medians
        }
        above = [s for s in measured if s > size]
        plain = base[: match.end()]
        if not above and plain != base:
            if not measured:  # knob values the table never measured: as the config's own
                return self._lookup(plain)
            return self._scaled_knobs(base, plain, size, measured, siblings)
        if not above:
            raise MissingMeasurement(f"the landscape has no measurement of {base}")
        high = min(above)
        # Below the smallest size measured, towards no throughput at no samples.
        low = max((s for s in measured if s < size), default=0)
        low_value, high_value = measured.get(low, 0.0), measured[high]
        share = (size - low) / (high - low)
        return self._configs[siblings[high]], low_value + share * (high_value - low_value)

    def _scaled_knobs(
        self,
        name: str,
        plain: str,
        size: int,
        measured: Mapping[int, float],
        siblings: Mapping[int, str],
    ) -> tuple[Mapping[str, Any], float | None]:
        """Knob values at a micro-batch the table measured them at another size only: the
        nearest size's value, scaled as the config's own knobs scale between the two sizes
        (and failing where they fail)."""
        entry, value = self._lookup(plain)
        if value is None:
            return entry, None
        nearest = min(measured, key=lambda s: (abs(s - size), s))
        _, reference = self._lookup(_SIZE.sub(f"_mbs{nearest}", plain, count=1))
        if reference is None:
            raise MissingMeasurement(f"the landscape has no measurement of {name}")
        return self._configs[siblings[nearest]], measured[nearest] * value / reference

    def run(self, spec: ExperimentSpec) -> ExperimentResult:
        entry, median = self._lookup(spec.repeat_of or spec.name)
        durations = entry.get("duration_s") or [0.0]
        timings = Timings(total_s=statistics.median(durations))
        if median is None:
            status = Status(entry["status"]) if entry["status"] != "ok" else Status.error
            return ExperimentResult(
                spec.name, status, error=entry.get("error") or status.value, timings=timings
            )
        rng = random.Random(zlib.crc32(f"{self._seed}/{spec.name}".encode()))
        throughput = median * rng.choice(self._noise)
        batch = int(spec.ds_config.get("train_batch_size") or 1)
        step_s = batch / throughput
        peak = self._peak_memory(spec.repeat_of or spec.name) or entry.get("peak_memory_bytes")
        metrics = Metrics.from_window([step_s], batch, 0.0, peak or 0)
        return ExperimentResult(spec.name, Status.ok, metrics, timings=timings)

    def _siblings(self, name: str) -> dict[int, str]:
        """The table's configurations that differ from ``name`` in the micro-batch only, by
        micro-batch (``name`` must hold one)."""
        match = _SIZE.search(name)
        assert match is not None
        rest = name[: match.start()] + name[match.end() :]
        return {
            int(m["size"]): other
            for other in self._configs
            if (m := _SIZE.search(other)) is not None
            and other[: m.start()] + other[m.end() :] == rest
        }

    def _peak_memory(self, name: str) -> int | None:
        """The peak memory of ``name``: measured, or at a size the table did not measure,
        interpolated linearly between the nearest sizes measured either side (memory grows
        linearly with the micro-batch; a tuner that reads peaks to find the largest fit
        must not see a step the GPU would not show). None where it cannot be interpolated."""
        if name in self._configs:
            return self._configs[name].get("peak_memory_bytes")
        match = _SIZE.search(name)
        if match is None:
            return None
        size = int(match["size"])
        peaks = {
            other_size: peak
            for other_size, other in self._siblings(name).items()
            if (peak := self._configs[other].get("peak_memory_bytes"))
        }
        below = [s for s in peaks if s < size]
        above = [s for s in peaks if s > size]
        if not below or not above:
            return None
        low, high = max(below), min(above)
        share = (size - low) / (high - low)
        return round(peaks[low] + share * (peaks[high] - peaks[low]))

    def __enter__(self) -> TableRunner:
        return self

    def __exit__(self, *exc: object) -> None:
        return None


@dataclass(frozen=True)
class Replay:
    """One tuning run replayed against a table.

    Attributes:
        values: the table's median of each experiment run, in order (None: it failed).
        names: the experiments run, in order.
        final: the median of the configuration the tuner declared best (None: none ran ok).
        best: the table's best median.
        cost_model: ``model_based``'s cost model as last fitted (as ``summary.json`` keeps it).
        answer: the overrides of the configuration the tuner declared best.
    """

    values: tuple[float | None, ...]
    final: float | None
    best: float
    names: tuple[str, ...] = ()
    cost_model: Mapping[str, Any] | None = None
    answer: Mapping[str, Any] | None = None

    def experiments_to(self, fraction: float) -> int | None:
        """Experiments run until one was worth ``fraction`` of the best (None: never)."""
        goal = fraction * self.best
        return next(
            (i for i, v in enumerate(self.values, start=1) if v is not None and v >= goal), None
        )

    def ends_within(self, fraction: float) -> bool:
        return self.final is not None and self.final >= fraction * self.best


def landscape_job(table: Mapping[str, Any], **autotuning: Any) -> TuningJob:
    """The tuning job a landscape was measured for, ``autotuning`` keys overridden."""
    how = table["how"]
    spec = json.loads(json.dumps(how["config"]))
    spec["autotuning"].update(autotuning)
    return TuningJob(
        config=load_config(spec, world_size=how["world_size"]),
        workload=how["workload"],
        workload_args=how["workload_args"],
        device_memory_bytes=how["device_memory_bytes"],
        cpus_per_rank=how.get("cpus_per_rank", 1),  # tables before it was recorded: 1
    )


def replay(
    table: Mapping[str, Any],
    tuner_type: str,
    seed: int,
    warm_start: WarmStart | None = None,
    **autotuning: Any,
) -> Replay:
    """Tune the table's job with ``tuner_type`` against the table (``seed`` seeds both),
    ``model_based`` warm-started as ``autotune serve`` starts a job after others.

    ``autotuning`` overrides keys of the table's ``autotuning`` section.
    """
    job = landscape_job(table, tuner_type=tuner_type, seed=seed, **autotuning)
    simulated = table["how"].get("simulated")  # a GPU's: the cost model starts from its sheet
    tuner = Tuner(
        job.config,
        ModelInfo(**table["model_info"]),
        device_memory_bytes=job.memory_budget,
        hardware=CATALOG[simulated["hardware"]] if simulated else None,
        warm_start=warm_start,
    )
    runner = TableRunner(table, seed)
    values, names, overrides = [], [], {}
    while (candidate := tuner.ask()) is not None:
        tuner.tell(runner.run(experiment_spec(job, candidate, flops_per_sample=None)))
        values.append(runner.value(candidate.name))
        names.append(candidate.name)
        overrides[candidate.name] = dict(candidate.overrides)
    summary = tuner.summary()
    best = summary.best
    return Replay(
        tuple(values),
        runner.value(best.name) if best is not None else None,
        runner.best_value,
        tuple(names),
        summary.cost_model,
        overrides.get(best.name) if best is not None else None,
    )
