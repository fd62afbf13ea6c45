"""Ranking: direction per metric, ties, medians of repeats, noise."""

from __future__ import annotations

from autotune.config import Metric
from autotune.experiment import ExperimentResult, Metrics, Status
from autotune.tuner import Ranked, rank, within_noise


def result(name: str, step_s: float, peak: int = 0, status: Status = Status.ok) -> ExperimentResult:
    metrics = Metrics.from_window([step_s], 8, 1e9, peak) if status is Status.ok else None
    return ExperimentResult(name, status, metrics)


def test_latency_lower_is_better() -> None:
    results = [result("slow", 2.0), result("fast", 1.0)]
    assert [r.name for r in rank(results, Metric.latency)] == ["fast", "slow"]


def test_throughput_and_flops_higher_is_better() -> None:
    results = [result("slow", 2.0), result("fast", 1.0)]
    assert [r.name for r in rank(results, Metric.throughput)] == ["fast", "slow"]
    assert [r.name for r in rank(results, Metric.flops)] == ["fast", "slow"]


def test_ties_go_to_lower_peak_memory() -> None:
    results = [result("big", 1.0, peak=200), result("small", 1.0, peak=100)]
    assert [r.name for r in rank(results, Metric.throughput)] == ["small", "big"]


def test_only_ok_results_rank() -> None:
    results = [result("oom", 1.0, status=Status.oom), result("ok", 5.0)]
    assert [r.name for r in rank(results, Metric.latency)] == ["ok"]


def test_repeats_rank_by_their_median() -> None:
    lucky = [result("lucky", 1.0), result("lucky_r1", 3.0), result("lucky_r2", 3.2)]
    steady = [result("steady", 2.0), result("steady_r1", 2.1), result("steady_r2", 1.9)]
    repeat_of = {r.name: r.name.split("_")[0] for r in lucky + steady if "_" in r.name}
    ranked = rank(lucky + steady, Metric.latency, repeat_of)
    assert [(r.name, r.value) for r in ranked] == [("steady", 2.0), ("lucky", 3.0)]
    assert len(rank(lucky + steady, Metric.latency)) == 6  # without: each its own
    assert ranked[1].values == (1.0, 3.0, 3.2) and round(ranked[1].spread, 3) == 0.733


def test_within_noise_when_ranges_overlap() -> None:
    assert within_noise(Ranked("a", 10, (9, 10, 11), 0), Ranked("b", 9, (8.5, 9, 9.5), 0))
    assert not within_noise(Ranked("a", 10, (10, 10.2), 0), Ranked("b", 9, (8.9, 9.1), 0))


def test_the_tuner_minimises_latency() -> None:
    from tests.tuner.landscape import Landscape, drive
    from tests.tuner.tuners import small_tuner

    landscape = Landscape()
    tuner = small_tuner("gridsearch", metric="latency", num_remeasure=0)
    asked = drive(tuner, landscape)
    ok = [c for c in asked if landscape.peak_bytes(c.ds_config) <= landscape.budget_bytes]
    fastest_step = min(ok, key=lambda c: landscape.step_time_s(c.ds_config))
    best = tuner.summary().best
    assert best is not None and best.name == fastest_step.name
