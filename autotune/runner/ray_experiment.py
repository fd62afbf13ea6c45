"""One experiment in flight on a gang of Ray rank actors: its futures, deadline and verdict.

An actor that dies, becomes unreachable or is killed by Ray's memory monitor is a rank's
outcome here (status ``error`` or ``oom``), never a raise.
"""

from __future__ import annotations

import re
import time
from dataclasses import replace
from typing import Any

import ray

from autotune.experiment import ExperimentResult, ExperimentSpec, Status, Timings
from autotune.runner.measuring_engine import measuring_engine
from autotune.runner.outcome import (
    FAILURE_GRACE_S,
    RankOutcome,
    experiment_verdict,
    failure_outcome,
    infrastructure_failure,
)
from autotune.runner.process import utc_now
from autotune.runner.ray_gang import DriverPaths, Gang

# How long a new gang's actors may take to start (a Python process each, torch imported)
# before its experiment fails: an experiment's own timeout starts only once they have. Ray
# itself fails an actor whose worker never registers; this bounds anything else (a start-up
# stuck in an import, a node too busy to start a process) so it is a result, never a hang.
ACTOR_START_TIMEOUT_S = 300.0


class RunningExperiment:
    """One experiment in flight on a gang: its ranks' futures, deadline and reports.

    Its ``timeout_s`` counts from when its ranks begin, once the gang's actors have started:
    a fresh gang's start-up is bounded by ``actor_start_timeout_s`` instead.
    """

    def __init__(
        self,
        spec: ExperimentSpec,
        gang: Gang,
        paths: DriverPaths,
        actor_start_timeout_s: float = ACTOR_START_TIMEOUT_S,
    ) -> None:
        self.spec, self.gang = spec, gang
        self.started_at, self.started = utc_now(), time.perf_counter()
        self._actor_start_timeout_s = actor_start_timeout_s
        self.ranks_began: float | None = None  # the experiment's clock; None while starting
        self._grace_deadline = float("inf")  # set by the first failure
        self._note_ranks_began()
        # Answered before each rank's run begins (an actor runs its calls in order): an actor
        # whose probe fails was lost before the experiment began on it.
        self._probes = {rank: actor.ready.remote() for rank, actor in enumerate(gang.actors)}
        # Passing rank 0's rendezvous future straight to every rank lets Ray deliver the
        # address without a driver round trip.
        init_method = gang.actors[0].rendezvous.remote()
        self.futures: dict[int, Any] = {
            rank: actor.run.remote(spec, rank, init_method, paths)
            for rank, actor in enumerate(gang.actors)
        }
        self.outcomes: dict[int, RankOutcome] = {}
        self.gang_broken = False  # a rank died or failed outside run_rank

    @property
    def deadline(self) -> float:
        """When the runner stops waiting: ``timeout_s`` after the ranks began (the start-up
        bound while the actors start), or a grace period after the first failure."""
        if self.ranks_began is None:
            clock = self.started + self._actor_start_timeout_s
        else:
            clock = self.ranks_began + self.spec.timeout_s
        return min(clock, self._grace_deadline)

    def waiting_on(self) -> list[Any]:
        """What the driver waits for: rank reports, and while the gang starts, its actors
        (so the experiment's clock starts when they are ready, not at the next report)."""
        reports = [f for rank, f in self.futures.items() if rank not in self.outcomes]
        return reports + (self.gang.starting() if self.ranks_began is None else [])

    def poll(self, ready: set[Any]) -> bool:
        """Collect the reports in ``ready``; True once the experiment has its verdict."""
        self._note_ranks_began()
        for rank, future in self.futures.items():
            if rank in self.outcomes or future not in ready:
                continue
            outcome = self._collect(rank, future)
            self.outcomes[rank] = outcome
            if outcome.status is not Status.ok:
                # The failed rank tore its group down; peers get a grace period to notice.
                # Peers of a failed rendezvous wait in it for nothing: no grace for them.
                grace_s = 0.0 if outcome.infrastructure else FAILURE_GRACE_S
                self._grace_deadline = min(self._grace_deadline, time.perf_counter() + grace_s)
        return len(self.outcomes) == self.spec.world_size or time.perf_counter() >= self.deadline

    def _note_ranks_began(self) -> None:
        if self.ranks_began is None and not self.gang.starting():
            self.ranks_began = time.perf_counter()

    @property
    def gang_reusable(self) -> bool:
        """Every rank answered and none died: the actors are idle and clean (and, for an
        engine whose gang is fresh after a failure, every rank succeeded)."""
        return (
            len(self.outcomes) == self.spec.world_size
            and not self.gang_broken
            and (
                not measuring_engine(self.spec.engine).fresh_after_failure
                or all(outcome.status is Status.ok for outcome in self.outcomes.values())
            )
        )

    def infrastructure_failure(self) -> str | None:
        """What failed, when the experiment failed in the machinery rather than in its
        configuration (see :attr:`RankOutcome.infrastructure`); else None."""
        cause = infrastructure_failure(self.outcomes.values())
        return (cause.error or "") if cause is not None else None

    def result(self) -> ExperimentResult:
        total_s = time.perf_counter() - self.started
        if self.ranks_began is None and not self.outcomes:
            return ExperimentResult(
                name=self.spec.name,
                status=Status.error,
                error="RankStartError: the rank actors had not started "
                f"within {self._actor_start_timeout_s:g} s",
                started_at=self.started_at,
                timings=Timings(total_s=total_s),
            )
        result = experiment_verdict(
            self.spec, self.outcomes, self.started_at, total_s, node_of=self.gang.node_id
        )
        if result.ok and self.ranks_began is not None:
            # A new gang's start-up (its processes, torch, DeepSpeed) was this experiment's.
            actors_s = self.ranks_began - self.started
            result = result.with_timings(startup_s=result.timings.startup_s + actors_s)
        return result

    def _collect(self, rank: int, future: Any) -> RankOutcome:
        try:
            outcome: RankOutcome = ray.get(future)
            return outcome
        except (
            ray.exceptions.ActorDiedError,
            # Unreachable, e.g. its node left the cluster; with no restarts it never returns.
            ray.exceptions.ActorUnavailableError,
            ray.exceptions.OutOfMemoryError,
        ) as exc:
            self.gang_broken = True
            # Ray's memory monitor kills a worker that runs a task: never before it began.
            oom = isinstance(exc, ray.exceptions.OutOfMemoryError)
            if not oom and self._lost_before_it_began(rank):
                return RankOutcome(
                    rank=rank,
                    status=Status.error,
                    error=f"RankLost: rank {rank} actor was lost before the experiment began "
                    f"({_death_cause(exc)})",
                    error_detail=_ANSI_ESCAPE.sub("", str(exc)),
                    failed_at=time.time(),
                    node_id=self.gang.node_id(rank),
                    infrastructure=True,
                )
            return self._actor_lost(rank, exc)
        except ray.exceptions.RayError as exc:  # e.g. the spec could not be unpickled
            self.gang_broken = True  # its state is unknown: do not reuse it
            # A task's error is Ray's wrapper, whose first line names the actor's process
            # (in colour); the exception it wraps names the problem.
            cause = getattr(exc, "cause", None)
            raised = cause if isinstance(cause, BaseException) else exc
            return replace(failure_outcome(rank, raised), node_id=self.gang.node_id(rank))

    def _lost_before_it_began(self, rank: int) -> bool:
        """Whether ``rank``'s actor was gone before its part of the experiment began: its
        probe, answered just before, failed too."""
        try:
            ray.get(self._probes[rank], timeout=1.0)
        except ray.exceptions.RayActorError:
            return True
        except ray.exceptions.RayError:  # not answered yet, or unknown: no evidence it was gone
            return False
        return False

    def _actor_lost(self, rank: int, exc: ray.exceptions.RayError) -> RankOutcome:
        """The outcome of a rank whose actor is gone: killed by Ray's memory monitor, or died."""
        if isinstance(exc, ray.exceptions.OutOfMemoryError):
            # The memory monitor kills an actor to save its node: the experiment needs more
            # host memory than the node has, an OOM rather than a crash.
            status = Status.oom
            error = (
                f"OutOfMemoryError: rank {rank} actor was killed by Ray's memory monitor "
                "(its node ran low on memory)"
            )
            peer_failure = False
        else:
            status = Status.error
            unreachable = isinstance(exc, ray.exceptions.ActorUnavailableError)
            how = "became unreachable (its node may have left)" if unreachable else "died"
            error = f"RankDied: rank {rank} actor {how} during the experiment ({_death_cause(exc)})"
            # Only the rank whose own actor died is a cause; a rank that merely waited for
            # rank 0's address reports rank 0's death.
            peer_failure = getattr(exc, "actor_id", None) != self._actor_id(rank)
        return RankOutcome(
            rank=rank,
            status=status,
            error=error,
            error_detail=_ANSI_ESCAPE.sub("", str(exc)),
            failed_at=time.time(),
            peer_failure=peer_failure,
            node_id=self.gang.node_id(rank),
        )

    def _actor_id(self, rank: int) -> str | None:
        actor_id = getattr(self.gang.actors[rank], "_actor_id", None)
        return actor_id.hex() if actor_id is not None else None


# Ray colours the process names in its messages for a terminal; in a file they are noise.
_ANSI_ESCAPE = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
# The lines of Ray's actor-death message that name this actor and its process, not why it
# died: they differ from one actor to the next, so two deaths alike would read differently.
_ACTOR_ID_LINE = re.compile(r"^\s*(class_name|actor_id|pid|name|namespace|ip):")


def _death_cause(exc: BaseException) -> str:
    r"""Why an actor died, on one line: for an actor whose start raised, the exception its
    start raised (Ray's message is that traceback, whose last line names it); else the
    worker's exit detail, or Ray's message less the lines that name the actor.

    Example:
        >>> import ray
        >>> exc = ray.exceptions.RayActorError(error_msg="The actor died because of an error "
        ...     "raised in its creation task, \x1b[36mray::A.__init__()\x1b[39m (pid=7)\n"
        ...     "  File \"a.py\", line 1, in __init__\nModuleNotFoundError: No module named 'x'",
        ...     actor_init_failed=True)
        >>> _death_cause(exc)
        "its start raised ModuleNotFoundError: No module named 'x'"
    """
    text = _ANSI_ESCAPE.sub("", str(exc))
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if getattr(exc, "actor_init_failed", False) and lines:
        return f"its start raised {lines[-1]}"
    flat = " ".join(text.split())
    match = re.search(r"Worker exit type: (\S+) Worker exit detail: (.*?)(?: Some common|$)", flat)
    if match:
        return f"{match.group(1)}: {match.group(2).strip()}"
    return " ".join(line for line in lines if not _ACTOR_ID_LINE.match(line))[:300]
