"""Run experiments on a warm pool of Ray actors: one actor per rank, placed as a gang.

Each experiment gets ``world_size`` actors ("a gang") held together by a placement group:
STRICT_PACK (one node) where a node can hold the whole gang, SPREAD only when the world size
needs several nodes, or the strategy asked for. A placement group's bundles are exclusive, so
two experiments running side by side never share a GPU or a CPU slot. The gang outlives the
experiment: torch is imported once, and the next experiment with the same shape reuses it,
paying only for a fresh process group on a free port of the rank-0 node, its workload and its
steps. :meth:`RayRunner.prestart` starts a gang before its first experiment is known, so
that its actors start (torch imported) while the caller does its own work. Independent
experiments run side by side while the cluster has room for their gangs
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
- A failure of the machinery, not of the configuration (the rendezvous port taken, an actor
  lost before the experiment began on it): the experiment runs again, first in line, on a
  fresh port and fresh actors where its were lost, up to ``INFRASTRUCTURE_RETRIES`` times
  (``infrastructure_retries`` counts them); if every attempt fails so, status ``error`` with
  a message that starts ``infrastructure:``. The port is held from when rank 0's actor picks
  it until the experiment ends, so that no other process can take it meanwhile.
- More GPUs per experiment than the cluster has at all: a ``ConfigError`` before the first
  experiment, as no experiment of that world size could ever be placed.

The ``ray_*`` modules are the only ones that import ray: this one, the front;
:mod:`autotune.runner.ray_gang`, the rank actors, their gangs and the pool that keeps them
warm; :mod:`autotune.runner.ray_experiment`, one experiment in flight on a gang; and
:mod:`autotune.runner.ray_cluster`, connecting to Ray. Ray starts embedded unless an address
is given (argument or ``RAY_ADDRESS``); the runner shuts down only a Ray it started itself.
The rank actors hold every CPU they ask for, so any driver-side Ray task added to these
modules must use ``num_cpus=0`` or it queues forever.
"""

from __future__ import annotations

import os
import time
from collections import deque
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import replace
from typing import Any

import ray

from autotune.config import ConfigError, EngineName
from autotune.experiment import ExperimentResult, ExperimentSpec, Status
from autotune.runner.outcome import INFRASTRUCTURE_RETRIES, infrastructure_result
from autotune.runner.process import PortReserver, reserve_port, utc_now
from autotune.runner.rank import run_rank
from autotune.runner.ray_cluster import connect_ray, shutdown_ray, worker_paths
from autotune.runner.ray_experiment import ACTOR_START_TIMEOUT_S, RunningExperiment
from autotune.runner.ray_gang import (
    ActorInfo,
    DriverPaths,
    Gang,
    GangKind,
    GangShape,
    Pool,
    RankFn,
    Strategy,
    ranks_per_node,
    release_parked,
    take_parked,
)

# While nothing of ours runs, how long an experiment may wait for its gang to be placed before
# it fails (a shared cluster may be busy; a request that can never fit fails at once).
PLACEMENT_TIMEOUT_S = 300.0
# How often the scheduler wakes up when no rank reports: for deadlines and pending placement.
POLL_S = 0.2
# Whether runners keep their actors warm for the next run of this process (see keep_warm)
# where the caller does not say: None defers to AUTOTUNE_RAY_KEEP_WARM=1 in the environment
# (read as each runner starts, so also for a process's children).
KEEP_WARM_ENV = "AUTOTUNE_RAY_KEEP_WARM"
KEEP_WARM_DEFAULT: bool | None = None


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
        reserve_port: how rank 0's actor holds the rendezvous port (tests inject a
            collision); runs in that actor.
        keep_warm: on a cluster this runner did not start, leave its idle actors running as
            it closes, for the next runner of this process (a notebook's next run): that run
            starts on actors that have imported torch and its scripts' libraries, while
            modules from outside the Python installation are imported afresh. They hold
            their CPUs and GPUs until a runner takes them or needs the room, or this process
            ends. Default: the environment variable ``AUTOTUNE_RAY_KEEP_WARM=1``.
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
        reserve_port: PortReserver = reserve_port,
        keep_warm: bool | None = None,
    ) -> None:
        self._owns_ray = connect_ray(address, num_cpus, quiet)
        if keep_warm is None:
            keep_warm = KEEP_WARM_DEFAULT
        if keep_warm is None:
            keep_warm = _keep_warm_from_env()
        self._keep_warm = keep_warm and not self._owns_ray
        self._worker_paths = worker_paths()  # what Ray's workers import from already
        if gpus_per_rank is None:
            gpus_per_rank = 1.0 if ray.cluster_resources().get("GPU", 0) >= 1 else 0.0
        self._gpus_per_rank = gpus_per_rank
        self._resources = tuple(sorted((resources_per_rank or {}).items()))
        self._strategy = strategy
        self._rank_fn = rank_fn
        self._preload_torch = preload_torch
        self._actor_start_timeout_s = actor_start_timeout_s
        self._reserve_port = reserve_port
        self._pool = Pool(self._make_gang)
        # Experiments run again after a failure of the machinery: by name, their retries so
        # far and when their first attempt started.
        self._retried: dict[str, tuple[int, str, float]] = {}
        self._queued: deque[ExperimentSpec] = deque()
        self._running: list[RunningExperiment] = []
        self._waiting_since = time.perf_counter()
        self._closed = False

    @property
    def uses_gpus(self) -> bool:
        """Whether rank actors hold GPUs (else they share the nodes' cores)."""
        return self._gpus_per_rank > 0

    def prestart(
        self, world_size: int, cpus_per_rank: int = 1, engine: EngineName = EngineName.builtin
    ) -> None:
        """Start a gang for experiments of this shape now (returns at once; its actors start
        in the background): the first such experiment takes it, its actors started or
        starting, while the caller did its own work.

        Nothing is started for a shape the cluster cannot hold (its experiments say why).
        """
        if self._closed:
            raise RuntimeError("this RayRunner is closed")
        try:
            self._check_gpus_fit(world_size)
        except ConfigError:
            return  # raised by the first experiment of this world size
        shape = self._gang_shape(world_size, cpus_per_rank, engine)
        if not self._missing(shape):
            self._pool.prestart(shape)

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
                finished = self._finish(experiment)
                if finished is not None:
                    results.append(finished)
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
        self._retried.clear()

    def capacity(self, world_size: int, cpus_per_rank: int = 1) -> int:
        """How many experiments of ``world_size`` ranks the live nodes hold at once, each
        gang with resources of its own (0: not even one).

        Raises:
            ConfigError: the cluster has too few GPUs for ``world_size`` ranks at all.
        """
        self._check_gpus_fit(world_size)
        shape = GangShape(world_size, cpus_per_rank, self._gpus_per_rank, self._resources)
        per_node = ranks_per_node(shape)
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
        """Kill the idle warm actors, and those earlier runners left warm (``keep_warm``),
        giving their resources back to the cluster."""
        self._pool.release_idle()
        release_parked()

    def close(self) -> None:
        """Kill every actor this runner started (with ``keep_warm``, park the idle ones for
        the next runner); shut Ray down if this runner started it."""
        if self._closed:
            return
        self._closed = True
        self._queued.clear()
        self._running.clear()
        # Nothing to keep where Ray was shut down under the runner.
        self._pool.close(keep_warm=self._keep_warm and ray.is_initialized())
        if self._owns_ray and ray.is_initialized():
            shutdown_ray()

    def __enter__(self) -> RayRunner:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _shape(self, spec: ExperimentSpec) -> GangShape:
        return self._gang_shape(spec.world_size, spec.cpus_per_rank, spec.engine)

    def _gang_shape(self, world_size: int, cpus_per_rank: int, engine: EngineName) -> GangShape:
        return GangShape(world_size, cpus_per_rank, self._gpus_per_rank, self._resources, engine)

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
                paths = DriverPaths.capture()
                self._running.append(
                    RunningExperiment(spec, gang, paths, self._actor_start_timeout_s)
                )
            else:
                refusals.append(refusal)
            self._queued.popleft()
            self._waiting_since = time.perf_counter()
        return refusals

    def _strategy_for(self, shape: GangShape, per_node: list[int] | None = None) -> Strategy:
        """The asked strategy, else one node for the whole gang where a node can hold it."""
        if self._strategy is not None:
            return self._strategy
        if per_node is None:
            per_node = ranks_per_node(shape)
        return "STRICT_PACK" if max(per_node, default=0) >= shape.world_size else "SPREAD"

    def _make_gang(self, shape: GangShape) -> Gang:
        threads = str(shape.cpus_per_rank)
        # Set by each actor before it imports torch: OpenMP reads them only once.
        env_vars = {"OMP_NUM_THREADS": threads, "MKL_NUM_THREADS": threads}
        if not shape.gpus_per_rank:
            # 0 GPUs means CPU ranks: a rank that sees a GPU takes it (NCCL), and ranks
            # sharing one GPU fail. Hidden here rather than trusting Ray's defaults for
            # actors that ask for no GPU, which have varied across versions.
            env_vars["CUDA_VISIBLE_DEVICES"] = ""
        # The modules an actor imports before any experiment arrives (the rank_fn's) are
        # found on the driver's paths: a cluster started here gave them to every worker as
        # it started; elsewhere, or if the driver's paths have grown since, the actors get
        # them in a runtime_env (and so workers of their own, started for them: seconds).
        paths = DriverPaths.capture().sys_path
        python_path = None if set(paths) <= set(self._worker_paths) else paths
        kind = GangKind(
            self._rank_fn,
            self._strategy_for(shape),
            tuple(sorted(env_vars.items())),
            self._preload_torch,
            self._reserve_port,
            python_path,
        )
        return take_parked(shape, kind) or Gang(shape, kind)

    def _finish(self, experiment: RunningExperiment) -> ExperimentResult | None:
        """The experiment's result, or None when it runs again: a failure of the machinery
        (see :attr:`RankOutcome.infrastructure`) is retried first in line, up to
        ``INFRASTRUCTURE_RETRIES`` times, on a fresh port (and fresh actors where its
        were lost). Its result counts the retries, and its timings cover every attempt."""
        result = experiment.result()
        if experiment.gang_reusable:
            self._pool.release(experiment.gang)
        else:  # hung, dead or unresponsive actors: not worth trusting with the next experiment
            self._pool.discard(experiment.gang, replace_it=True)
        spec = experiment.spec
        retries, started_at, started = self._retried.pop(
            spec.name, (0, experiment.started_at, experiment.started)
        )
        cause = experiment.infrastructure_failure()
        if cause is not None and retries < INFRASTRUCTURE_RETRIES:
            self._retried[spec.name] = (retries + 1, started_at, started)
            self._queued.appendleft(spec)
            return None
        result = replace(result, started_at=started_at, infrastructure_retries=retries)
        result = result.with_timings(total_s=time.perf_counter() - started)
        return infrastructure_result(result, cause, retries) if cause is not None else result

    def _unplaceable(
        self, spec: ExperimentSpec, running: list[RunningExperiment], waiting_since: float
    ) -> ExperimentResult | None:
        """A result for ``spec`` if its gang can never be placed, or has waited too long."""
        shape = self._shape(spec)
        missing = self._missing(shape)
        if missing:
            reason = f"needs {missing} in all but the cluster has {ray.cluster_resources()}"
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

    def _missing(self, shape: GangShape) -> dict[str, float]:
        """What a gang of ``shape`` needs in all beyond what the whole cluster has."""
        totals = ray.cluster_resources()
        return {
            name: amount * shape.world_size
            for name, amount in shape.bundle().items()
            if amount * shape.world_size > totals.get(name, 0)
        }

    def _wait(self, running: list[RunningExperiment], idle: bool) -> list[Any]:
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


def _keep_warm_from_env() -> bool:
    value = os.environ.get(KEEP_WARM_ENV, "")
    if value not in ("", "0", "1"):
        raise ConfigError(KEEP_WARM_ENV, f"{value!r} is neither 1 (keep warm) nor 0 (do not)")
    return value == "1"


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
