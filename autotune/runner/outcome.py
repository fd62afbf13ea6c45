"""What ranks report and how every rank's report becomes one verdict for the experiment."""

from __future__ import annotations

import os
import time
import traceback
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from autotune.experiment import ExperimentResult, ExperimentSpec, Metrics, Status, Timings
from autotune.profiling.interference import oversubscription

# After the first rank fails, how long the others get to report before they are killed.
FAILURE_GRACE_S = 10.0
TRACEBACK_LINES = 12
# How many times a runner runs an experiment again after a failure of the machinery rather
# than of the configuration (RankOutcome.infrastructure), before recording it as an error
# whose message starts with "infrastructure:".
INFRASTRUCTURE_RETRIES = 2


@dataclass
class RankOutcome:
    """What one rank reports back to its runner (picklable, JSON-ready)."""

    rank: int
    status: Status
    metrics: dict[str, Any] | None = None
    error: str | None = None
    error_detail: str | None = None
    failed_at: float | None = None  # time.time() of the failure: the earliest is the cause
    # True when this rank failed only because a peer went away (its collective lost the peer,
    # or the runner killed it after a peer failed): a consequence, never the cause.
    peer_failure: bool = False
    startup_s: float = 0.0
    warmup_s: float = 0.0
    window_s: float = 0.0
    # From the window's end to the report: what follows the window (the metrics; a script's
    # FLOP-counting step where the window began at step 1), the engine and process group torn
    # down, memory released.
    teardown_s: float = 0.0
    node_id: str = field(default_factory=lambda: os.uname().nodename)
    # Script mode: the optimizer steps the script took when it ended before the window did.
    ended_after_steps: int | None = None
    # Script mode: a rank's share of the script's data, in samples, where the micro-batch
    # was more than it (every larger micro-batch would be too).
    samples_per_rank: int | None = None
    # The timed steps after which the window ended, slower than spec.stop_above_step_s.
    stopped_after_steps: int | None = None
    # True when the failure is the machinery's, not the configuration's: the rendezvous port
    # was taken, or the rank's actor was lost before the experiment began. Run again.
    infrastructure: bool = False
    # What this rank saw of its node's CPUs over the window (profiling.interference.WindowCpu).
    window_cpu: dict[str, Any] | None = None


def failure_outcome(rank: int, exc: BaseException) -> RankOutcome:
    """The outcome of a rank that raised ``exc``: oom or error, with its traceback's tail."""
    status = Status.oom if is_out_of_memory(exc) else Status.error
    lines = traceback.format_exception(exc)
    detail = "".join(lines).splitlines()[-TRACEBACK_LINES:]
    message = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return RankOutcome(
        rank=rank,
        status=status,
        error=f"{type(exc).__name__}: {message}" if message else type(exc).__name__,
        error_detail="\n".join(detail),
        failed_at=time.time(),
        peer_failure=status is Status.error and is_lost_peer(exc),
        ended_after_steps=getattr(exc, "ended_after_steps", None),
        samples_per_rank=getattr(exc, "samples_per_rank", None),
        infrastructure=is_port_taken(exc),
    )


def is_port_taken(exc: BaseException) -> bool:
    """The rendezvous could not listen on its port: another process bound it first (the
    store's ``DistNetworkError ... EADDRINUSE``), whatever raised it along the way."""
    seen: BaseException | None = exc
    while seen is not None:
        text = str(seen).lower()
        if "eaddrinuse" in text or "address already in use" in text:
            return True
        seen = seen.__cause__ or seen.__context__
    return False


# What gloo and NCCL say when the other end of a collective went away.
_LOST_PEER_MARKERS = (
    "connection closed by peer",
    "connection reset by peer",
    "gloo/transport/tcp",
    "broken pipe",
    "remote process exited",
    "nccl communicator was aborted",
)


def is_lost_peer(exc: BaseException) -> bool:
    """A collective failed because a peer rank died or tore its process group down."""
    text = str(exc).lower()
    return isinstance(exc, RuntimeError | ConnectionError | OSError) and any(
        marker in text for marker in _LOST_PEER_MARKERS
    )


def is_out_of_memory(exc: BaseException) -> bool:
    """A real CUDA OOM or the engine's budget OOM (both ``torch.OutOfMemoryError``)."""
    import torch

    oom_type = getattr(torch, "OutOfMemoryError", torch.cuda.OutOfMemoryError)
    return isinstance(exc, oom_type) or "out of memory" in str(exc).lower()[:200]


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


def failure_cause(outcomes: Iterable[RankOutcome]) -> RankOutcome | None:
    """The failure that ended the experiment: the first (by time, then rank) that was not
    merely a lost peer; None when every rank succeeded."""
    failures = [o for o in outcomes if o.status is not Status.ok]
    if not failures:
        return None
    causes = [o for o in failures if not o.peer_failure] or failures
    return min(causes, key=lambda o: (o.failed_at or float("inf"), o.rank))


def infrastructure_failure(outcomes: Iterable[RankOutcome]) -> RankOutcome | None:
    """The cause of the experiment's failure when it is the machinery's (see
    :attr:`RankOutcome.infrastructure`): run it again rather than record it."""
    cause = failure_cause(outcomes)
    return cause if cause is not None and cause.infrastructure else None


def infrastructure_result(result: ExperimentResult, cause: str, retries: int) -> ExperimentResult:
    """``result`` of an experiment whose every attempt failed in the machinery: an error that
    says so (``infrastructure: ...``), never the configuration's."""
    attempts = retries + 1
    return replace(
        result,
        status=Status.error,
        metrics=None,
        error=f"infrastructure: {cause} ({attempts} attempt{'s' if attempts > 1 else ''}, "
        "each on a fresh port and, where the ranks were lost, fresh ranks)",
        infrastructure_retries=retries,
    )


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
    cause = failure_cause(ordered)
    if cause is not None:
        return ExperimentResult(
            name=name,
            status=cause.status,
            error=cause.error,
            error_detail=cause.error_detail,
            failed_rank=cause.rank,
            started_at=started_at,
            node_ids=node_ids,
            ended_after_steps=cause.ended_after_steps,
            samples_per_rank=cause.samples_per_rank,
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
        timings=Timings(
            startup_s=lead.startup_s,
            warmup_s=lead.warmup_s,
            window_s=lead.window_s,
            # Every rank's windows end together (a barrier); the experiment waits for the last.
            teardown_s=max(o.teardown_s for o in ordered),
        ),
        node_ids=node_ids,
        stopped_after_steps=lead.stopped_after_steps,
    )
