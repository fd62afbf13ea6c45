"""combine_outcomes: one verdict from every rank's report."""

from __future__ import annotations

from autotune.experiment import Metrics, Status
from autotune.runner import RankOutcome, combine_outcomes


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
