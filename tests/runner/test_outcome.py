"""combine_outcomes and experiment_verdict: one verdict from every rank's report (or silence)."""

from __future__ import annotations

from autotune.experiment import ExperimentSpec, Metrics, Status
from autotune.runner import RankOutcome, combine_outcomes, experiment_verdict
from tests.specs import job_spec


def _ok(rank: int, peak: int) -> RankOutcome:
    metrics = Metrics.from_window([0.5, 0.7, 0.6], 8, 6e9, peak).to_dict()
    return RankOutcome(rank=rank, status=Status.ok, metrics=metrics, warmup_s=1, window_s=1.8)


def test_all_ok_takes_rank0_window_and_max_peak_memory() -> None:
    result = combine_outcomes("e", [_ok(1, 300), _ok(0, 100)], "t")
    assert result.status is Status.ok and result.metrics is not None
    assert result.metrics.peak_memory_bytes == 300
    assert result.metrics.latency == 0.6 and result.metrics.throughput == 8 / 0.6
    assert result.timings.window_s == 1.8


def test_the_first_real_failure_is_the_cause_not_the_lost_peer() -> None:
    lost_peer = RankOutcome(
        rank=0,
        status=Status.error,
        error="RuntimeError: Connection closed by peer",
        failed_at=1.0,
        peer_failure=True,
    )
    cause = RankOutcome(rank=1, status=Status.error, error="ValueError: bad", failed_at=2.0)
    result = combine_outcomes("e", [lost_peer, cause], "t")
    assert (result.status, result.error, result.failed_rank) == (Status.error, "ValueError: bad", 1)


def test_oom_on_one_rank_makes_the_experiment_oom() -> None:
    oom = RankOutcome(rank=1, status=Status.oom, error="OutOfMemoryError: x", failed_at=1.0)
    result = combine_outcomes("e", [_ok(0, 1), oom], "t")
    assert result.status is Status.oom and result.metrics is None


def _spec(world_size: int = 2) -> ExperimentSpec:
    return job_spec("e", world_size=world_size, timeout_s=30)


def test_silence_without_a_failure_is_a_timeout() -> None:
    result = experiment_verdict(_spec(3), {1: _ok(1, 100)}, "t", total_s=30.5)
    assert result.status is Status.timeout and result.metrics is None
    assert result.error == "timeout: no verdict within 30 s (1 of 3 ranks had finished)"
    assert result.timings.total_s == 30.5


def test_a_silent_rank_after_a_failure_is_a_peer_failure_not_the_cause() -> None:
    oom = RankOutcome(rank=0, status=Status.oom, error="OutOfMemoryError: x", failed_at=1.0)
    result = experiment_verdict(_spec(), {0: oom}, "t", total_s=12.0, node_of=lambda r: f"n{r}")
    assert (result.status, result.error, result.failed_rank) == (
        Status.oom,
        "OutOfMemoryError: x",
        0,
    )
    assert result.node_ids[1] == "n1" and result.timings.total_s == 12.0


def test_when_every_failure_is_a_lost_peer_the_earliest_report_is_the_cause() -> None:
    lost_peer = RankOutcome(
        rank=0, status=Status.error, error="RuntimeError: lost", failed_at=1.0, peer_failure=True
    )
    result = experiment_verdict(_spec(), {0: lost_peer}, "t", total_s=12.0)
    assert result.status is Status.error and result.failed_rank == 0


def test_every_rank_reporting_is_combined_with_the_runners_wall_time() -> None:
    result = experiment_verdict(_spec(), {0: _ok(0, 100), 1: _ok(1, 200)}, "t", total_s=9.0)
    assert result.status is Status.ok and result.metrics is not None
    assert result.metrics.peak_memory_bytes == 200 and result.timings.total_s == 9.0
