"""Gangs of warm rank actors: one Ray actor per rank, placed together by a placement group.

A gang holds ``world_size`` actors of one :class:`GangShape`; its placement group's bundles are
exclusive, so two gangs never share a GPU or a CPU slot. The :class:`Pool` keeps gangs warm
between experiments, by shape, and evicts idle ones when another shape needs their room.

A runner that keeps its gangs warm (``RayRunner(keep_warm=True)``) parks its idle gangs as it
closes, for the next runner of this process on the same cluster (:func:`take_parked`): a
notebook's second run, or the next test, then starts on actors that have imported torch and
the libraries its scripts use. A parked gang holds its resources until a runner takes it, a
runner needs them for a gang of another kind, or the process or cluster ends.
"""

from __future__ import annotations

import contextlib
import gc
import os
import sys
import time
from collections.abc import Callable, Mapping
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

from autotune.config.autotuning import EngineName
from autotune.experiment import ExperimentSpec
from autotune.runner.measuring_engine import measuring_engine
from autotune.runner.outcome import RankOutcome, failure_outcome
from autotune.runner.process import (
    PortReservation,
    PortReserver,
    forget_modules_from_outside,
    interpreter_dirs,
    own_import_root,
    proc_status,
    reserve_port,
)

RankFn = Callable[[ExperimentSpec, int, str], RankOutcome]
"""What a rank actor runs: ``(spec, rank, init_method) -> RankOutcome``, never raising."""

Strategy = Literal["PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD"]
"""Ray's placement-group strategies; the STRICT ones fail to place rather than bend."""

# A gang that has not been placed after this long makes room by evicting an idle gang of
# another shape (placement normally takes milliseconds when resources are free).
EVICT_AFTER_S = 0.5


@dataclass(frozen=True)
class GangShape:
    """What one gang holds: the pool's key. Experiments of the same shape share gangs."""

    world_size: int
    cpus_per_rank: int
    gpus_per_rank: float
    resources_per_rank: tuple[tuple[str, float], ...] = ()
    # What measures the experiments: its actors prepare it as they start.
    engine: EngineName = EngineName.builtin

    def bundle(self) -> dict[str, float]:
        """One rank's resources, as a placement-group bundle."""
        bundle = {"CPU": float(self.cpus_per_rank), **dict(self.resources_per_rank)}
        if self.gpus_per_rank:
            bundle["GPU"] = self.gpus_per_rank
        return bundle


@dataclass(frozen=True)
class GangKind:
    """What, beside its shape, a gang's actors were started with: a parked gang serves a
    runner whose gangs would be started alike (:func:`take_parked`)."""

    rank_fn: RankFn
    strategy: Strategy
    env_vars: tuple[tuple[str, str], ...]
    preload_torch: bool = True
    reserve: PortReserver = reserve_port
    # The workers' PYTHONPATH (a runtime_env), None where Ray's workers import what the
    # driver imports.
    python_path: tuple[str, ...] | None = None


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
class DriverPaths:
    """The driver's working directory and import paths, so ``pkg.mod:fn`` imports in actors.

    Sent with every experiment rather than only at actor start-up: a warm actor then also
    finds modules on paths the driver added after the actor started.
    """

    cwd: str
    sys_path: tuple[str, ...]

    @classmethod
    def capture(cls) -> DriverPaths:
        # The interpreter's own directories (stdlib, site-packages) are left out: on another
        # node they could shadow that node's installation. The folder autotune is imported
        # from goes last, so that a directory named autotune in the working directory (a
        # clone, seen from the folder that holds it) cannot shadow it in a worker.
        installed = interpreter_dirs()
        paths = [os.getcwd()] + [
            os.path.abspath(p) for p in sys.path if p and not p.startswith(installed)
        ]
        root = own_import_root()
        paths += [root] if root is not None else []
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

    def __init__(
        self,
        rank_fn: RankFn,
        shape: GangShape,
        preload_torch: bool = True,
        reserve: PortReserver = reserve_port,
        env_vars: Mapping[str, str] | None = None,
    ) -> None:
        # What a new run puts back (see begin_run).
        self._start_path, self._start_cwd = list(sys.path), os.getcwd()
        # Set here, before torch is imported, rather than by a runtime_env: an actor with a
        # runtime_env of its own cannot take one of the workers Ray starts ahead (measured:
        # 0.6-1.7 s more per gang on 2 cores). Nothing in a fresh worker has loaded OpenMP or
        # CUDA yet, and each reads its variables once, as it loads.
        os.environ.update(env_vars or {})
        self._preload = preload_torch
        if preload_torch:
            import torch

            from autotune.runner.rank import preload_rank_modules

            torch.set_num_threads(shape.cpus_per_rank)
            preload_rank_modules()  # what a fresh launch pays every time, paid once here
            self._prepare(shape)
        self._rank_fn = rank_fn
        self._reserve = reserve
        self._reservation: PortReservation | None = None
        gc.freeze()

    def _prepare(self, shape: GangShape) -> None:
        # A failure here is left for the experiment to meet and report with its traceback.
        with contextlib.suppress(Exception):
            measuring_engine(shape.engine).prepare(shape.world_size)

    def ready(self) -> None:
        """Answers once the actor has started (its ``__init__`` done)."""

    def begin_run(self, shape: GangShape) -> None:
        """Another run takes this warm actor, for experiments of ``shape``: its code is
        imported afresh, as a new actor would (a file edited since, or another run's module
        of the same name), while torch and the installed libraries stay imported. The import
        path and working directory are put back as they were when the actor started (the
        next experiment applies its driver's), and the engine is prepared as a new actor's."""
        sys.path[:] = self._start_path
        if os.path.isdir(self._start_cwd):
            os.chdir(self._start_cwd)
        forget_modules_from_outside()
        if self._preload:
            self._prepare(shape)

    def rendezvous(self) -> str:
        """Where this experiment's ranks meet: a port on this (the rank-0) node, held until
        this actor's rank has run (see :class:`autotune.runner.process.PortReservation`)."""
        host = ray.util.get_node_ip_address()
        self._release_port()
        self._reservation = self._reserve(host)
        url_host = f"[{host}]" if ":" in host else host
        return f"tcp://{url_host}:{self._reservation.port}"

    def _release_port(self) -> None:
        if self._reservation is not None:
            self._reservation.close()
            self._reservation = None

    def run(
        self, spec: ExperimentSpec, rank: int, init_method: str, paths: DriverPaths
    ) -> RankOutcome:
        paths.apply()
        try:
            outcome = self._rank_fn(spec, rank, init_method)
        except Exception as exc:  # run_rank never raises; an injected rank_fn might
            outcome = failure_outcome(rank, exc)
        finally:
            self._release_port()
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


class Gang:
    """``world_size`` warm rank actors in one placement group; runs one experiment at a time."""

    def __init__(self, shape: GangShape, kind: GangKind) -> None:
        """``kind.env_vars``: set by each actor as it starts; ``kind.python_path``: its
        workers' ``PYTHONPATH`` (a runtime_env, so fresh workers)."""
        self.shape = shape
        self.kind = kind
        self.created = time.monotonic()
        self.last_used = self.created
        self.busy = False
        self._placed = False
        bundle = shape.bundle()
        self.group: PlacementGroup = placement_group([bundle] * shape.world_size, kind.strategy)
        self._ready = self.group.ready()
        custom = dict(shape.resources_per_rank)
        runtime_env = None
        if kind.python_path is not None:
            runtime_env = {"env_vars": {"PYTHONPATH": os.pathsep.join(kind.python_path)}}
        env_vars = dict(kind.env_vars)
        self.actors: list[Any] = [
            _RemoteRankActor.options(
                num_cpus=shape.cpus_per_rank,
                num_gpus=shape.gpus_per_rank,
                resources=custom or None,
                scheduling_strategy=PlacementGroupSchedulingStrategy(
                    self.group, placement_group_bundle_index=rank
                ),
                runtime_env=runtime_env,
            ).remote(kind.rank_fn, shape, kind.preload_torch, kind.reserve, env_vars)
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

    def begin_run(self, shape: GangShape) -> None:
        """Hand this gang to another run, for experiments of ``shape`` (its engine may differ
        from the last run's; see :meth:`_RankActor.begin_run`). Until its actors are done,
        the gang counts as starting: the first experiment's ranks begin after."""
        self.shape = shape
        self._starting = [actor.begin_run.remote(shape) for actor in self.actors]

    def kill(self) -> None:
        for actor in self.actors:
            ray.kill(actor, no_restart=True)
        remove_placement_group(self.group)


# Gangs that runners which keep them warm left idle as they closed, with the GCS address of
# the cluster they run on: for the next runner of this process (see the module's doc).
_parked: list[tuple[str, Gang]] = []


def park(gang: Gang) -> None:
    _parked.append((ray.get_runtime_context().gcs_address, gang))


def take_parked(shape: GangShape, kind: GangKind) -> Gang | None:
    """A parked gang of ``shape`` (but perhaps another engine, prepared as it is taken) and
    ``kind`` on the connected cluster, handed to a new run; None if there is none, and then
    every other parked gang is killed: the gang to be started in its stead needs the room.
    Gangs of a cluster since shut down are forgotten."""
    address = ray.get_runtime_context().gcs_address
    _parked[:] = [(where, gang) for where, gang in _parked if where == address]
    for entry in _parked:
        gang = entry[1]
        if replace(gang.shape, engine=shape.engine) == shape and gang.kind == kind:
            _parked.remove(entry)
            gang.last_used = time.monotonic()
            gang.begin_run(shape)
            return gang
    release_parked()
    return None


def release_parked() -> None:
    """Kill the parked gangs, giving their resources back to the cluster."""
    while _parked:
        with contextlib.suppress(Exception):  # an actor already gone, or its cluster
            _parked.pop()[1].kill()


class Pool:
    """Gangs by shape: idle ones are reused, and evicted (oldest first) when another shape
    needs their resources."""

    def __init__(self, make_gang: Callable[[GangShape], Gang]) -> None:
        self._make_gang = make_gang
        self.gangs: list[Gang] = []

    def take(self, shape: GangShape) -> Gang | None:
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

    def prestart(self, shape: GangShape) -> None:
        """Start a gang of ``shape`` now, unless an idle one is there: the next experiment of
        that shape takes it, its actors started (or starting) meanwhile."""
        if not any(g.shape == shape and not g.busy for g in self.gangs):
            self.gangs.append(self._make_gang(shape))

    def release(self, gang: Gang) -> None:
        gang.busy = False
        gang.last_used = time.monotonic()

    def discard(self, gang: Gang, *, replace_it: bool) -> None:
        """Kill ``gang``; with ``replace_it`` start its successor now (its start-up then
        overlaps whatever the driver does next)."""
        self.gangs.remove(gang)
        gang.kill()
        if replace_it:
            self.gangs.append(self._make_gang(gang.shape))

    def release_idle(self) -> None:
        for gang in [g for g in self.gangs if not g.busy]:
            self.discard(gang, replace_it=False)

    def close(self, keep_warm: bool = False) -> None:
        """Kill every gang; with ``keep_warm``, park the idle ones whose actors have started
        instead (see :func:`take_parked`)."""
        for gang in self.gangs:
            if keep_warm and not gang.busy and gang.placed() and not gang.starting():
                park(gang)
            else:
                gang.kill()
        self.gangs.clear()

    def _evict_one_idle(self, other_than: GangShape) -> None:
        idle = [g for g in self.gangs if g.shape != other_than and not g.busy and g.placed()]
        if idle:
            self.discard(min(idle, key=lambda g: g.last_used), replace_it=False)


def ranks_per_node(shape: GangShape) -> list[int]:
    """Per live node, how many rank bundles of ``shape`` its resources hold."""
    bundle = {name: amount for name, amount in shape.bundle().items() if amount > 0}
    return [
        min(
            int(node["Resources"].get(name, 0.0) / amount + 1e-6) for name, amount in bundle.items()
        )
        for node in ray.nodes()
        if node.get("Alive")
    ]
