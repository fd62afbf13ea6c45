"""Run experiments on a warm pool of Ray actors: one actor per rank, placed as a gang.

Each experiment gets ``world_size`` actors ("a gang") held together by a placement group:
STRICT_PACK (one node) where a node can hold the whole gang, SPREAD only when the world size
needs several nodes, or the strategy asked for. A placement group's bundles are exclusive, so
two experiments running side by side never share a GPU or a CPU slot. The gang outlives the
experiment: torch is imported once, and the next experiment with the same shape reuses it,
paying only for a fresh process group on a free port of the rank-0 node, its workload and its
steps. Independent experiments run side by side while the cluster has room for their gangs
(:meth:`RayRunner.submit` / :meth:`RayRunner.wait`; :meth:`RayRunner.capacity` says how many).

Failure isolation, mirroring :mod:`autotune.runner.local`:

- OOM or an exception on a rank: ``run_rank`` tears its process group down, every rank
  reports, the result carries the status, and the gang stays warm.
- A hang: the experiment is cut at ``spec.timeout_s``; its actors are killed and replaced. The
  timeout counts from when the ranks begin: a new gang's start-up (processes, torch imports)
  is bounded separately (``actor_start_timeout_s``; past it, status ``error``).
- An actor that dies (kill -9, segfault, its node leaving the cluster): status ``error``
  naming the death; the gang is replaced. Only the experiment on that gang fails; the others
  running keep going. Ray's death report cannot tell the kernel's OOM killer from other causes.
- An actor killed by Ray's memory monitor: status ``oom``; the gang is replaced.
- More GPUs per experiment than the cluster has at all: a ``ConfigError`` before the first
  experiment, as no experiment of that world size could ever be placed.

This is the only module that imports ray. Ray starts embedded unless an address is given
(argument or ``RAY_ADDRESS``); the runner shuts down only a Ray it started itself. The rank
actors hold every CPU they ask for, so any driver-side Ray task added here must use
``num_cpus=0`` or it queues forever.
"""

from __future__ import annotations

import gc
import logging
import os
import re
import sys
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, replace
from typing import Any, Literal

import ray
from ray.util.placement_group import (
    PlacementGroup,
    placement_group,
    placement_group_table,
    remove_placement_group,
)
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from autotune.config import ConfigError
from autotune.engines import FRESH_AFTER_FAILURE
from autotune.experiment import ExperimentResult, ExperimentSpec, Status, Timings
from autotune.runner.outcome import (
    FAILURE_GRACE_S,
    RankOutcome,
    experiment_verdict,
    failure_outcome,
)
from autotune.runner.process import entries_set, free_port, proc_status, utc_now
from autotune.runner.rank import run_rank

_WORKER_NICENESS = "RAY_worker_niceness"  # Ray's own spelling: its raylet reads this name

RankFn = Callable[[ExperimentSpec, int, str], RankOutcome]
"""What a rank actor runs: ``(spec, rank, init_method) -> RankOutcome``, never raising."""

Strategy = Literal["PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD"]
"""Ray's placement-group strategies; the STRICT ones fail to place rather than bend."""

# While nothing of ours runs, how long an experiment may wait for its gang to be placed before
# it fails (a shared cluster may be busy; a request that can never fit fails at once).
PLACEMENT_TIMEOUT_S = 300.0
# A gang that has not been placed after this long makes room by evicting an idle gang of
# another shape (placement normally takes milliseconds when resources are free).
EVICT_AFTER_S = 0.5
# How often the scheduler wakes up when no rank reports: for deadlines and pending placement.
POLL_S = 0.2
# How long a new gang's actors may take to start (a Python process each, torch imported)
# before its experiment fails: an experiment's own timeout starts only once they have. Ray
# itself fails an actor whose worker never registers; this bounds anything else (a start-up
# stuck in an import, a node too busy to start a process) so it is a result, never a hang.
ACTOR_START_TIMEOUT_S = 300.0


@dataclass(frozen=True)
class GangShape:
    """What one gang holds: the pool's key. Experiments of the same shape share gangs."""

    world_size: int
    cpus_per_rank: int
    gpus_per_rank: float
    resources_per_rank: tuple[tuple[str, float], ...] = ()

    def bundle(self) -> dict[str, float]:
        """One rank's resources, as a placement-group bundle."""
        bundle = {"CPU": float(self.cpus_per_rank), **dict(self.resources_per_rank)}
        if self.gpus_per_rank:
            bundle["GPU"] = self.gpus_per_rank
        return bundle


@dataclass(frozen=True)
class ActorInfo:
    """A warm rank actor as it is between experiments (see :meth:`RayRunner.actors`)."""

    world_size: int
    rank: int
    pid: int
    node_id: str
    rss_bytes: int
    num_threads: int
    process_group_initialized: bool  # must be False between experiments


@dataclass(frozen=True)
class _DriverPaths:
    """The driver's working directory and import paths, so ``pkg.mod:fn`` imports in actors.

    Sent with every experiment rather than only at actor start-up: a warm actor then also
    finds modules on paths the driver added after the actor started.
    """

    cwd: str
    sys_path: tuple[str, ...]

    @classmethod
    def capture(cls) -> _DriverPaths:
        # The interpreter's own directories (stdlib, site-packages) are left out: on another
        # node they could shadow that node's installation.
        installed = tuple({sys.prefix, sys.base_prefix, sys.exec_prefix})
        paths = [os.getcwd()] + [
            os.path.abspath(p) for p in sys.path if p and not p.startswith(installed)
        ]
        return cls(cwd=os.getcwd(), sys_path=tuple(dict.fromkeys(paths)))

    def apply(self) -> None:
        if os.path.isdir(self.cwd):
            os.chdir(self.cwd)
        for path in self.sys_path:
            # Appended, not prepended: an import path must not shadow an installed package.
            if path not in sys.path and os.path.isdir(path):
                sys.path.append(path)


class _RankActor:
    """One rank's warm process. Decorated with ``ray.remote`` below."""

    def __init__(self, rank_fn: RankFn, num_threads: int, preload_torch: bool = True) -> None:
        if preload_torch:
            import torch  # the import a fresh launch pays every time, paid once here

            from autotune.engine.launch import import_before_process_groups

            torch.set_num_threads(num_threads)
            import_before_process_groups()  # else paid inside the first experiment
        self._rank_fn = rank_fn
        gc.freeze()

    def ready(self) -> None:
        """Answers once the actor has started (its ``__init__`` done)."""

    def rendezvous(self) -> str:
        """Where this experiment's ranks meet: a free port on this (the rank-0) node."""
        host = ray.util.get_node_ip_address()
        url_host = f"[{host}]" if ":" in host else host
        return f"tcp://{url_host}:{free_port(host)}"

    def run(
        self, spec: ExperimentSpec, rank: int, init_method: str, paths: _DriverPaths
    ) -> RankOutcome:
        paths.apply()
        try:
            outcome = self._rank_fn(spec, rank, init_method)
        except Exception as exc:  # run_rank never raises; an injected rank_fn might
            outcome = failure_outcome(rank, exc)
        # What survived run_rank's full collection is long-lived (torch, modules): frozen, the
        # next experiment's collection skips it. Measured: 0.2-0.35 s of each experiment's
        # overhead went to rescanning ~330k such objects.
        gc.freeze()
        return replace(outcome, node_id=ray.get_runtime_context().get_node_id())

    def info(self) -> dict[str, Any]:
        import torch.distributed as dist

        status = proc_status()
        return {
            "pid": os.getpid(),
            "node_id": ray.get_runtime_context().get_node_id(),
            "rss_bytes": status.get("VmRSS", 0) * 1024,
            "num_threads": status.get("Threads", 0),
            "process_group_initialized": dist.is_available() and dist.is_initialized(),
        }


_RemoteRankActor: Any = ray.remote(max_restarts=0, max_task_retries=0)(_RankActor)


class _Gang:
    """``world_size`` warm rank actors in one placement group; runs one experiment at a time."""

    def __init__(
        self,
        shape: GangShape,
        rank_fn: RankFn,
        strategy: Strategy,
        env_vars: Mapping[str, str],
        preload_torch: bool = True,
    ) -> None:
        self.shape = shape
        self.created = time.monotonic()
        self.last_used = self.created
        self.busy = False
        self._placed = False
        bundle = shape.bundle()
        self.group: PlacementGroup = placement_group([bundle] * shape.world_size, strategy)
        self._ready = self.group.ready()
        custom = dict(shape.resources_per_rank)
        self.actors: list[Any] = [
            _RemoteRankActor.options(
                num_cpus=shape.cpus_per_rank,
                num_gpus=shape.gpus_per_rank,
                resources=custom or None,
                scheduling_strategy=PlacementGroupSchedulingStrategy(
                    self.group, placement_group_bundle_index=rank
                ),
                runtime_env={"env_vars": dict(env_vars)},
            ).remote(rank_fn, shape.cpus_per_rank, preload_torch)
            for rank in range(shape.world_size)
        ]
        self._starting = [actor.ready.remote() for actor in self.actors]

    def placed(self) -> bool:
        if not self._placed:
            ready, _ = ray.wait([self._ready], timeout=0)
            self._placed = bool(ready)
        return self._placed

    def starting(self) -> list[Any]:
        """The actors' start-up answers still awaited (none: every actor has started, or
        failed to; an experiment's ranks begin at once)."""
        if self._starting:
            _, self._starting = ray.wait(self._starting, num_returns=len(self._starting), timeout=0)
        return self._starting

    def node_id(self, rank: int) -> str:
        """The Ray node that holds ``rank``'s bundle (for reports its actor could not make)."""
        nodes = placement_group_table(self.group).get("bundles_to_node_id", {})
        return str(nodes.get(rank, ""))

    def kill(self) -> None:
        for actor in self.actors:
            ray.kill(actor, no_restart=True)
        remove_placement_group(self.group)


class _Pool:
    """Gangs by shape: idle ones are reused, and evicted (oldest first) when another shape
    needs their resources."""

    def __init__(self, make_gang: Callable[[GangShape], _Gang]) -> None:
        self._make_gang = make_gang
        self.gangs: list[_Gang] = []

    def take(self, shape: GangShape) -> _Gang | None:
        """A placed idle gang of ``shape`` marked busy, or None while one is being placed."""
        idle = [g for g in self.gangs if g.shape == shape and not g.busy]
        for gang in idle:
            if gang.placed():
                gang.busy = True
                return gang
        if not idle:
            self.gangs.append(self._make_gang(shape))
        elif time.monotonic() - idle[0].created > EVICT_AFTER_S:
            self._evict_one_idle(other_than=shape)
        return None

    def release(self, gang: _Gang) -> None:
        gang.busy = False
        gang.last_used = time.monotonic()

    def discard(self, gang: _Gang, *, replace_it: bool) -> None:
        """Kill ``gang``; with ``replace_it`` start its successor now (its start-up then
        overlaps whatever the driver does next)."""
        self.gangs.remove(gang)
        gang.kill()
        if replace_it:
            self.gangs.append(self._make_gang(gang.shape))

    def release_idle(self) -> None:
        for gang in [g for g in self.gangs if not g.busy]:
            self.discard(gang, replace_it=False)

    def close(self) -> None:
        for gang in self.gangs:
            gang.kill()
        self.gangs.clear()

    def _evict_one_idle(self, other_than: GangShape) -> None:
        idle = [g for g in self.gangs if g.shape != other_than and not g.busy and g.placed()]
        if idle:
            self.discard(min(idle, key=lambda g: g.last_used), replace_it=False)


class _Running:
    """One experiment in flight on a gang: its ranks' futures, deadline and reports.

    Its ``timeout_s`` counts from when its ranks begin, once the gang's actors have started:
    a fresh gang's start-up is bounded by ``actor_start_timeout_s`` instead.
    """

    def __init__(
        self,
        spec: ExperimentSpec,
        gang: _Gang,
        paths: _DriverPaths,
        actor_start_timeout_s: float = ACTOR_START_TIMEOUT_S,
    ) -> None:
        self.spec, self.gang = spec, gang
        self.started_at, self.started = utc_now(), time.perf_counter()
        self._actor_start_timeout_s = actor_start_timeout_s
        self.ranks_began: float | None = None  # the experiment's clock; None while starting
        self._grace_deadline = float("inf")  # set by the first failure
        self._note_ranks_began()
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
                self._grace_deadline = min(
                    self._grace_deadline, time.perf_counter() + FAILURE_GRACE_S
                )
        return len(self.outcomes) == self.spec.world_size or time.perf_counter() >= self.deadline

    def _note_ranks_began(self) -> None:
        if self.ranks_began is None and not self.gang.starting():
            self.ranks_began = time.perf_counter()

    @property
    def gang_reusable(self) -> bool:
        """Every rank answered and none died: the actors are idle and clean (and, for an
        engine in ``FRESH_AFTER_FAILURE``, every rank succeeded)."""
        return (
            len(self.outcomes) == self.spec.world_size
            and not self.gang_broken
            and (
                self.spec.engine not in FRESH_AFTER_FAILURE
                or all(outcome.status is Status.ok for outcome in self.outcomes.values())
            )
        )

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
        return experiment_verdict(
            self.spec, self.outcomes, self.started_at, total_s, node_of=self.gang.node_id
        )

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
            return self._actor_lost(rank, exc)
        except ray.exceptions.RayError as exc:  # e.g. the spec could not be unpickled
            self.gang_broken = True  # its state is unknown: do not reuse it
            return replace(failure_outcome(rank, exc), node_id=self.gang.node_id(rank))

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
            error_detail=str(exc),
            failed_at=time.time(),
            peer_failure=peer_failure,
            node_id=self.gang.node_id(rank),
        )

    def _actor_id(self, rank: int) -> str | None:
        actor_id = getattr(self.gang.actors[rank], "_actor_id", None)
        return actor_id.hex() if actor_id is not None else None


def _death_cause(exc: BaseException) -> str:
    """The part of Ray's actor-death message that says why, e.g. the worker exit detail."""
    text = " ".join(str(exc).split())
    match = re.search(r"Worker exit type: (\S+) Worker exit detail: (.*?)(?: Some common|$)", text)
    if match:
        return f"{match.group(1)}: {match.group(2).strip()}"
    return text[:300]


class RayRunner:
    """Runs experiments on warm Ray actors; a failed experiment is a result, never a raise.

    Example (an embedded Ray of 2 CPUs, the mlp on 2 ranks at ZeRO stages 1 and 2):
        >>> from autotune.experiment import ExperimentSpec
        >>> def spec(stage):
        ...     config = {"train_batch_size": 4, "train_micro_batch_size_per_gpu": 2,
        ...               "gradient_accumulation_steps": 1, "zero_optimization": {"stage": stage}}
        ...     return ExperimentSpec(f"z{stage}_mbs2", config, workload="mlp", workload_args={},
        ...                           world_size=2, start_profile_step=1, end_profile_step=2,
        ...                           timeout_s=120, seed=0, cpus_per_rank=1)
        >>> with RayRunner(num_cpus=2) as runner:  # the actors stay warm between experiments
        ...     results = list(runner.run_many([spec(1), spec(2)]))  # as they end; run(): one
        >>> sorted((r.name, r.status.value, r.metrics.throughput > 0) for r in results)
        [('z1_mbs2', 'ok', True), ('z2_mbs2', 'ok', True)]

    Args:
        address: an existing Ray cluster (``"auto"``, ``"host:port"``); default
            ``RAY_ADDRESS`` if set, else an embedded Ray is started.
        num_cpus: CPUs of an embedded Ray (default: all of this machine's).
        gpus_per_rank: GPUs per rank actor; default 1 when the cluster has GPUs, else 0.
            An experiment of more ranks than the cluster's GPUs allow raises ``ConfigError``
            before anything runs (0 runs ranks without GPUs).
        resources_per_rank: custom Ray resources each rank actor needs, e.g. to pin ranks to
            labelled nodes (``{"node_a": 0.5}``).
        strategy: how a gang's ranks are placed; default STRICT_PACK (all on one node) where
            a node can hold the gang and SPREAD where the world size needs several nodes.
            ``PACK`` / ``SPREAD`` / ``STRICT_SPREAD`` force Ray's strategy of that name.
        rank_fn: what each rank runs; tests inject stand-ins for ``run_rank``.
        preload_torch: import torch as a rank actor starts, before its first experiment
            (a stand-in ``rank_fn`` that never uses torch skips the import's seconds).
        quiet: keep the actors' logs out of the driver's terminal (failures still come back
            in the results).
        actor_start_timeout_s: how long a new gang's actors may take to start before the
            experiment waiting for them fails (its ``timeout_s`` starts once they have).
    """

    def __init__(
        self,
        address: str | None = None,
        *,
        num_cpus: int | None = None,
        gpus_per_rank: float | None = None,
        resources_per_rank: Mapping[str, float] | None = None,
        strategy: Strategy | None = None,
        rank_fn: RankFn = run_rank,
        preload_torch: bool = True,
        quiet: bool = True,
        actor_start_timeout_s: float = ACTOR_START_TIMEOUT_S,
    ) -> None:
        self._owns_ray = connect_ray(address, num_cpus, quiet)
        if gpus_per_rank is None:
            gpus_per_rank = 1.0 if ray.cluster_resources().get("GPU", 0) >= 1 else 0.0
        self._gpus_per_rank = gpus_per_rank
        self._resources = tuple(sorted((resources_per_rank or {}).items()))
        self._strategy = strategy
        self._rank_fn = rank_fn
        self._preload_torch = preload_torch
        self._actor_start_timeout_s = actor_start_timeout_s
        self._pool = _Pool(self._make_gang)
        self._queued: deque[ExperimentSpec] = deque()
        self._running: list[_Running] = []
        self._waiting_since = time.perf_counter()
        self._closed = False

    @property
    def uses_gpus(self) -> bool:
        """Whether rank actors hold GPUs (else they share the nodes' cores)."""
        return self._gpus_per_rank > 0

    def run(self, spec: ExperimentSpec) -> ExperimentResult:
        """Run ``spec`` and return its result; never raises for a failed experiment.

        Raises:
            ConfigError: the cluster has too few GPUs for ``spec.world_size`` ranks.
        """
        return next(self.run_many([spec]))

    def run_many(self, specs: Iterable[ExperimentSpec]) -> Iterator[ExperimentResult]:
        """Run ``specs``, side by side while the cluster has room, yielding results as they
        finish.

        Experiments start in the order given (a large one is not overtaken by small ones).
        Leaving the loop early, an exception or Ctrl-C kills the experiments still running.

        Raises:
            ConfigError: before any experiment starts, if the cluster has too few GPUs for the
                world size of one of ``specs``.
        """
        specs = list(specs)
        for world_size in sorted({spec.world_size for spec in specs}):
            self._check_gpus_fit(world_size)
        for spec in specs:
            self.submit(spec)
        finished = False
        try:
            while self._queued or self._running:
                yield from self.wait()
            finished = True
        finally:
            if not finished:
                self.cancel()

    def submit(self, spec: ExperimentSpec) -> None:
        """Queue ``spec``; it starts, in submission order, as soon as its gang is placed.

        Its result comes back from :meth:`wait`. Submit at most :meth:`capacity` at once to
        have every one start at once.

        Raises:
            ConfigError: the cluster has too few GPUs for ``spec.world_size`` ranks.
        """
        if self._closed:
            raise RuntimeError("this RayRunner is closed")
        self._check_gpus_fit(spec.world_size)
        if not self._queued:
            self._waiting_since = time.perf_counter()
        self._queued.append(spec)

    def wait(self) -> list[ExperimentResult]:
        """Start what fits, then block until at least one submitted experiment finishes;
        its result, with any others finished by then (empty once nothing is submitted)."""
        results: list[ExperimentResult] = []
        while not results and (self._queued or self._running):
            results += self._start_queued()
            ready = set(self._wait(self._running, idle=bool(self._queued)))
            for experiment in [e for e in self._running if e.poll(ready)]:
                self._running.remove(experiment)
                results.append(self._finish(experiment))
        return results

    def running(self) -> list[str]:
        """Names of the experiments running now (placed and started)."""
        return [e.spec.name for e in self._running]

    def cancel(self) -> None:
        """Stop every submitted experiment: queued ones are dropped, running ones killed
        with their gangs (placement groups released). Their results are never reported."""
        self._queued.clear()
        for experiment in self._running:
            self._pool.discard(experiment.gang, replace_it=False)
        self._running.clear()

    def capacity(self, world_size: int, cpus_per_rank: int = 1) -> int:
        """How many experiments of ``world_size`` ranks the live nodes hold at once, each
        gang with resources of its own (0: not even one).

        Raises:
            ConfigError: the cluster has too few GPUs for ``world_size`` ranks at all.
        """
        self._check_gpus_fit(world_size)
        shape = GangShape(world_size, cpus_per_rank, self._gpus_per_rank, self._resources)
        per_node = _ranks_per_node(shape)
        if self._strategy_for(shape, per_node) == "STRICT_PACK":
            return sum(n // shape.world_size for n in per_node)
        return sum(per_node) // shape.world_size

    def actors(self) -> list[ActorInfo]:
        """The idle warm actors, with their memory and threads (busy and dead ones are
        skipped)."""
        gangs = [g for g in self._pool.gangs if not g.busy and g.placed()]
        futures = [(g, rank, a.info.remote()) for g in gangs for rank, a in enumerate(g.actors)]
        infos = []
        for gang, rank, future in futures:
            try:
                info = ray.get(future)
            except ray.exceptions.RayActorError:
                continue  # found out, and replaced, by its next experiment
            infos.append(ActorInfo(world_size=gang.shape.world_size, rank=rank, **info))
        return infos

    def release_idle(self) -> None:
        """Kill the idle warm actors, giving their resources back to the cluster."""
        self._pool.release_idle()

    def close(self) -> None:
        """Kill every actor this runner started; shut Ray down if this runner started it."""
        if self._closed:
            return
        self._closed = True
        self._queued.clear()
        self._running.clear()
        self._pool.close()
        if self._owns_ray and ray.is_initialized():
            ray.shutdown()

    def __enter__(self) -> RayRunner:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _shape(self, spec: ExperimentSpec) -> GangShape:
        return GangShape(spec.world_size, spec.cpus_per_rank, self._gpus_per_rank, self._resources)

    def _check_gpus_fit(self, world_size: int) -> None:
        if self._gpus_per_rank:
            cluster_gpus = ray.cluster_resources().get("GPU", 0.0)
            check_gpus_fit(world_size, self._gpus_per_rank, cluster_gpus)

    def _start_queued(self) -> list[ExperimentResult]:
        """Start queued experiments, in order, while their gangs can be placed; the results
        of those that never can be."""
        refusals = []
        while self._queued:
            spec = self._queued[0]
            refusal = self._unplaceable(spec, self._running, self._waiting_since)
            if refusal is None:
                gang = self._pool.take(self._shape(spec))
                if gang is None:
                    break
                paths = _DriverPaths.capture()
                self._running.append(_Running(spec, gang, paths, self._actor_start_timeout_s))
            else:
                refusals.append(refusal)
            self._queued.popleft()
            self._waiting_since = time.perf_counter()
        return refusals

    def _strategy_for(self, shape: GangShape, ranks_per_node: list[int] | None = None) -> Strategy:
        """The asked strategy, else one node for the whole gang where a node can hold it."""
        if self._strategy is not None:
            return self._strategy
        if ranks_per_node is None:
            ranks_per_node = _ranks_per_node(shape)
        return "STRICT_PACK" if max(ranks_per_node, default=0) >= shape.world_size else "SPREAD"

    def _make_gang(self, shape: GangShape) -> _Gang:
        threads = str(shape.cpus_per_rank)
        env_vars = {
            # Set before the actor's interpreter starts: OpenMP reads it only once.
            "OMP_NUM_THREADS": threads,
            "MKL_NUM_THREADS": threads,
            # For modules the actor must import before any experiment arrives (the rank_fn's).
            "PYTHONPATH": os.pathsep.join(_DriverPaths.capture().sys_path),
        }
        if not shape.gpus_per_rank:
            # 0 GPUs means CPU ranks: a rank that sees a GPU takes it (NCCL), and ranks
            # sharing one GPU fail. Hidden here rather than trusting Ray's defaults for
            # actors that ask for no GPU, which have varied across versions.
            env_vars["CUDA_VISIBLE_DEVICES"] = ""
        strategy = self._strategy_for(shape)
        return _Gang(shape, self._rank_fn, strategy, env_vars, self._preload_torch)

    def _finish(self, experiment: _Running) -> ExperimentResult:
        result = experiment.result()
        if experiment.gang_reusable:
            self._pool.release(experiment.gang)
        else:  # hung, dead or unresponsive actors: not worth trusting with the next experiment
            self._pool.discard(experiment.gang, replace_it=True)
        return result

    def _unplaceable(
        self, spec: ExperimentSpec, running: list[_Running], waiting_since: float
    ) -> ExperimentResult | None:
        """A result for ``spec`` if its gang can never be placed, or has waited too long."""
        shape = self._shape(spec)
        totals = ray.cluster_resources()
        missing = {
            name: amount * shape.world_size
            for name, amount in shape.bundle().items()
            if amount * shape.world_size > totals.get(name, 0)
        }
        if missing:
            reason = f"needs {missing} in all but the cluster has {totals}"
        elif not running and time.perf_counter() - waiting_since > PLACEMENT_TIMEOUT_S:
            reason = f"no room on the cluster within {PLACEMENT_TIMEOUT_S:g} s"
        else:
            return None
        return ExperimentResult(
            name=spec.name,
            status=Status.error,
            error=f"PlacementError: {shape.world_size} ranks of {shape.bundle()}: {reason}",
            started_at=utc_now(),
        )

    def _wait(self, running: list[_Running], idle: bool) -> list[Any]:
        """Block until a rank reports, the nearest deadline passes, or (with experiments
        waiting for room) the next placement check is due."""
        futures = [f for e in running for f in e.waiting_on()]
        now = time.perf_counter()
        timeout = min([e.deadline - now for e in running], default=POLL_S)
        if idle:
            timeout = min(timeout, POLL_S)
        timeout = max(timeout, 0.0)
        if not futures:
            time.sleep(timeout)
            return []
        ready, _ = ray.wait(futures, num_returns=1, timeout=timeout)
        if not ready:
            return []
        # Whatever else has finished by now comes along without waiting.
        done, _ = ray.wait(futures, num_returns=len(futures), timeout=0)
        return list(done) or list(ready)


def check_gpus_fit(world_size: int, gpus_per_rank: float, cluster_gpus: float) -> None:
    """Raise :class:`ConfigError` if ``world_size`` ranks of ``gpus_per_rank`` GPUs each
    exceed the cluster's ``cluster_gpus``.

    Every experiment of that world size would then fail placement, one by one; one error up
    front says what to change instead.
    """
    needed = world_size * gpus_per_rank
    if needed <= cluster_gpus + 1e-6:  # Ray counts resources in units of 1e-4
        return
    fitting = int(cluster_gpus / gpus_per_rank + 1e-6)
    fewer_ranks = f"a world size of at most {fitting}, or " if fitting else ""
    raise ConfigError(
        "world_size",
        f"{world_size} ranks need {needed:g} GPUs ({gpus_per_rank:g} per rank) but the Ray "
        f"cluster has {cluster_gpus:g}; use {fewer_ranks}gpus_per_rank=0 (--gpus-per-rank 0) "
        "to run the ranks without GPUs",
    )


def _ranks_per_node(shape: GangShape) -> list[int]:
    """Per live node, how many rank bundles of ``shape`` its resources hold."""
    bundle = {name: amount for name, amount in shape.bundle().items() if amount > 0}
    return [
        min(
            int(node["Resources"].get(name, 0.0) / amount + 1e-6) for name, amount in bundle.items()
        )
        for node in ray.nodes()
        if node.get("Alive")
    ]


def connect_ray(address: str | None, num_cpus: int | None, quiet: bool) -> bool:
    """Connect to Ray, or start a local cluster (``num_cpus`` CPUs, default all); True if this
    call started it (and so its caller must shut it down)."""
    if ray.is_initialized():
        return False
    address = address or os.environ.get("RAY_ADDRESS")
    # Quiet: Ray's own start-up notices (auth tokens, dashboard) are not the user's business.
    level = logging.ERROR if quiet else logging.WARNING
    common: dict[str, Any] = {"log_to_driver": not quiet, "logging_level": level}
    if address:
        ray.init(address=address, **common)
        return False
    # Ray starts workers at niceness 15, so the ranks of an experiment yielded the CPU to any
    # other process on the node (a notebook, a build) and measured its load, not the config.
    # Ranks run as training would; an explicit RAY_worker_niceness still wins.
    niceness = {_WORKER_NICENESS: os.environ.get(_WORKER_NICENESS, "0")}
    with entries_set(os.environ, niceness):
        ray.init(num_cpus=num_cpus or os.cpu_count(), include_dashboard=False, **common)
    return True
