"""Turning every rank's report into one verdict for the experiment."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace

from autotune.experiment import ExperimentResult, ExperimentSpec, Metrics, Status, Timings
from autotune.profiling.interference import oversubscription
from autotune.runner.rank import RankOutcome


def experiment_verdict(
    spec: ExperimentSpec,
    reports: Mapping[int, RankOutcome],
    started_at: str,
    total_s: float,
    node_of: Callable[[int], str] | None = None,
) -> ExperimentResult:
    """The result of an experiment once its runner stops waiting for it, every rank reported
    or not.

    A rank missing from ``reports`` is silent: it neither reported nor was seen to die before
    the runner stopped it (at the deadline, or a grace period after a peer's failure). With no
    failure reported, silence means the experiment ran out of time: status ``timeout``. After
    a failure, silence is that failure's consequence: a silent rank is recorded as a peer
    failure (never the cause) and every rank is combined by :func:`combine_outcomes`.

    Args:
        spec: the experiment.
        reports: by rank, what each rank that was heard from reported.
        started_at: when the experiment started (ISO 8601).
        total_s: the experiment's wall time as the runner saw it.
        node_of: the node a silent rank ran on (default: this machine).
    """
    if len(reports) < spec.world_size and all(o.status is Status.ok for o in reports.values()):
        return ExperimentResult(
            name=spec.name,
            status=Status.timeout,
            error=f"timeout: no verdict within {spec.timeout_s:g} s "
            f"({len(reports)} of {spec.world_size} ranks had finished)",
            started_at=started_at,
            timings=Timings(total_s=total_s),
        )
    outcomes = [
        reports[rank] if rank in reports else _silent_after_failure(rank, node_of)
        for rank in range(spec.world_size)
    ]
    result = combine_outcomes(spec.name, outcomes, started_at, spec.cpus_per_rank)
    return result.with_timings(total_s=total_s)


def _silent_after_failure(rank: int, node_of: Callable[[int], str] | None) -> RankOutcome:
    outcome = RankOutcome(
        rank=rank,
        status=Status.error,
        error=f"RankUnresponsive: rank {rank} gave no report after a peer's failure; "
        "the runner stopped it",
        failed_at=time.time(),
        peer_failure=True,
    )
    return replace(outcome, node_id=node_of(rank)) if node_of is not None else outcome


def combine_outcomes(
    name: str, outcomes: Sequence[RankOutcome], started_at: str, threads_per_rank: int = 1
) -> ExperimentResult:
    """One result from all ranks' outcomes.

    All ranks reach the same verdict: if any failed, the experiment failed with the cause of
    the first failure that was not merely a lost peer (a rank whose collective lost the rank
    that really failed reports a secondary error). Metrics come from rank 0, whose window is
    synchronised with every other rank's; peak memory is the maximum over ranks; how far other
    processes oversubscribed the cores comes from every rank's view of its node.
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
            ended_after_steps=cause.ended_after_steps,
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
    busy = oversubscription((o.window_cpu for o in ordered), threads_per_rank)
    metrics = replace(metrics, peak_memory_bytes=peak, oversubscription=busy)
    return ExperimentResult(
        name=name,
        status=Status.ok,
        metrics=metrics,
        started_at=started_at,
        timings=Timings(startup_s=lead.startup_s, warmup_s=lead.warmup_s, window_s=lead.window_s),
        node_ids=node_ids,
    )
