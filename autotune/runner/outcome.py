"""Turning every rank's report into one verdict for the experiment."""

from __future__ import annotations

from collections.abc import Sequence

from autotune.experiment import ExperimentResult, Metrics, Status, Timings
from autotune.runner.rank import RankOutcome


def combine_outcomes(
    name: str, outcomes: Sequence[RankOutcome], started_at: str
) -> ExperimentResult:
    """One result from all ranks' outcomes.

    All ranks reach the same verdict: if any failed, the experiment failed with the cause of
    the first failure that was not merely a lost peer (a rank whose collective lost the rank
    that really failed reports a secondary error). Metrics come from rank 0, whose window is
    synchronised with every other rank's; peak memory is the maximum over ranks.
    """
    ordered = sorted(outcomes, key=lambda o: o.rank)
    node_ids = tuple(o.node_id for o in ordered)
    failures = [o for o in ordered if o.status is not Status.ok]
    if failures:
        causes = [o for o in failures if not o.peer_failure] or failures
        cause = min(causes, key=lambda o: (o.failed_at or float("inf"), o.rank))
        return ExperimentResult(
            name=name,
            status=cause.status,
            error=cause.error,
            error_detail=cause.error_detail,
            failed_rank=cause.rank,
            started_at=started_at,
            node_ids=node_ids,
        )
    lead = ordered[0]
    if lead.metrics is None:  # a runner bug, still recorded rather than raised
        return ExperimentResult(
            name=name,
            status=Status.error,
            error="RunnerError: rank 0 reported success without metrics",
            started_at=started_at,
            node_ids=node_ids,
        )
    metrics = Metrics.from_dict(lead.metrics)
    peak = max(int((o.metrics or {}).get("peak_memory_bytes", 0)) for o in ordered)
    metrics = Metrics.from_window(
        metrics.step_times_s, metrics.train_batch_size, metrics.flops_per_step, peak
    )
    return ExperimentResult(
        name=name,
        status=Status.ok,
        metrics=metrics,
        started_at=started_at,
        timings=Timings(startup_s=lead.startup_s, warmup_s=lead.warmup_s, window_s=lead.window_s),
        node_ids=node_ids,
    )
