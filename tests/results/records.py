"""Experiment records the results tests share: a fingerprint, specs and results."""

from __future__ import annotations

from autotune.experiment import ExperimentResult, ExperimentSpec, Metrics, Status, Timings
from autotune.metric import Metric
from autotune.results import ResultsDir
from autotune.tuner.record import finish, name_trial
from autotune.tuner.trials import PHASE_ATTR, REPEAT_OF_ATTR
from tests.specs import job_spec

FINGERPRINT = {"tuned": {"workload": "gpt", "world_size": 2}, "versions": {"autotune": "0"}}


def make_spec(name: str, stage: int = 1, micro: int = 4) -> ExperimentSpec:
    return job_spec(
        name,
        {
            "train_batch_size": micro * 2,
            "train_micro_batch_size_per_gpu": micro,
            "gradient_accumulation_steps": 1,
            "zero_optimization": {"stage": stage, "reduce_bucket_size": 5 * 10**8},
        },
    )


def make_result(
    name: str, status: Status = Status.ok, throughput: float = 10.0
) -> ExperimentResult:
    metrics = None
    if status is Status.ok:
        latency = 8 / throughput
        metrics = Metrics.from_window([latency] * 3, 8, 1e9, peak_memory_bytes=2**30)
    return ExperimentResult(
        name=name,
        status=status,
        metrics=metrics,
        error=None if status is Status.ok else "RuntimeError: boom",
        started_at="2026-11-22T00:00:00+00:00",
        timings=Timings(startup_s=1.0, warmup_s=2.0, window_s=3.0, total_s=6.5),
        node_ids=("node-a", "node-a"),
    )


def commit(
    results: ResultsDir,
    spec: ExperimentSpec,
    result: ExperimentResult,
    metric: Metric = Metric.throughput,
    repeat_of: str | None = None,
) -> None:
    """Record a finished experiment as a run does: its files, then its trial in the run's
    study (the commit point), as a tuner tells it."""
    results.save(spec, result)
    study = results.study(metric, attrs={"target": spec.target, "engine": spec.engine.value})
    trial = study.ask()
    name_trial(trial, {"name": result.name, PHASE_ATTR: "model", REPEAT_OF_ATTR: repeat_of})
    finish(study, trial, result, spec.ds_config, metric)
