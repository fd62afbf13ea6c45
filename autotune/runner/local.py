"""Run one experiment as ``world_size`` fresh local processes (spawn; gloo on CPU, NCCL on GPUs).

The simplest runner: what tests and a single machine without Ray use. Each experiment pays
for its processes' start-up; the Ray runner keeps them warm instead.
"""

from __future__ import annotations

import contextlib
import ctypes
import multiprocessing as mp
import os
import queue
import signal
import time
from collections.abc import Mapping, Sequence
from dataclasses import replace
from functools import lru_cache

from autotune.config import ConfigError
from autotune.experiment import ExperimentResult, ExperimentSpec, Status, Timings
from autotune.runner.outcome import (
    FAILURE_GRACE_S,
    INFRASTRUCTURE_RETRIES,
    RankOutcome,
    experiment_verdict,
    infrastructure_failure,
    infrastructure_result,
)
from autotune.runner.process import PortReserver, entries_set, free_port, reserve_port, utc_now

# How a process killed by SIGKILL ends: -9 from multiprocessing, 128 + 9 through a shell.
_SIGKILL_EXIT_CODES = (-signal.SIGKILL.value, 128 + signal.SIGKILL.value)


class LocalRunner:
    """Runs experiments one at a time on this machine, each in fresh rank processes.

    Args:
        reserve_port: how the rendezvous port is held (tests inject a collision).
    """

    def __init__(self, reserve_port: PortReserver = reserve_port) -> None:
        self._reserve_port = reserve_port

    def run(self, spec: ExperimentSpec) -> ExperimentResult:
        """Run ``spec`` and return its result; never raises for a failed experiment.

        Raises:
            ConfigError: this machine has GPUs but fewer than ``spec.world_size``.
        """
        check_local_gpus(spec.world_size, visible_gpus())
        return run_local(spec, self._reserve_port)


class InProcessRunner:
    """Runs one-rank experiments in this process, one after another, warm.

    For a benchmark on one GPU, where a fresh process per experiment (torch's import, CUDA's
    start, the rendezvous) would cost more than the experiment: each experiment still gets a
    fresh process group, workload and engine, and its memory is released after it, as in a
    warm Ray actor. Unlike :class:`LocalRunner` it cannot stop a hung experiment or survive
    one that kills its process: a tuner run uses the others.
    """

    def run(self, spec: ExperimentSpec) -> ExperimentResult:
        from autotune.runner.rank import run_rank

        if spec.world_size != 1:
            raise ConfigError("world_size", f"runs in one process: 1, not {spec.world_size}")
        started_at, started = utc_now(), time.perf_counter()
        outcome = run_rank(spec, 0, f"tcp://127.0.0.1:{free_port()}")
        return experiment_verdict(spec, {0: outcome}, started_at, time.perf_counter() - started)


def check_local_gpus(world_size: int, num_gpus: int) -> None:
    """Raise :class:`ConfigError` if ``world_size`` local ranks cannot have a GPU each.

    A rank uses a GPU whenever one is visible, one rank per GPU: two NCCL ranks on one GPU
    fail every experiment, so this is said once, before any runs. ``num_gpus`` 0 runs the
    ranks on CPU (gloo), any number of them.
    """
    if num_gpus and world_size > num_gpus:
        raise ConfigError(
            "world_size",
            f"{world_size} local ranks need {world_size} GPUs (one each) but this machine "
            f"has {num_gpus}; use a world size of at most {num_gpus}, or hide the GPUs "
            "(CUDA_VISIBLE_DEVICES=) to run the ranks on CPU",
        )


def local_resources() -> Mapping[str, float]:
    """What experiments run on without Ray: this machine's cores and GPUs."""
    return {"CPU": float(os.cpu_count() or 1), "GPU": float(visible_gpus())}


@lru_cache(maxsize=1)
def visible_gpus() -> int:
    """The GPUs this process sees (CUDA's count is fixed once CUDA starts)."""
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def run_local(spec: ExperimentSpec, reserve: PortReserver = reserve_port) -> ExperimentResult:
    """Run ``spec`` on ``spec.world_size`` spawned processes with a wall-clock limit.

    A rank that raises, runs out of memory, dies or outlives ``spec.timeout_s`` gives a result
    with status ``error`` / ``oom`` / ``timeout``; a rank process killed by SIGKILL (most
    likely the kernel's OOM killer) gives ``oom``. A failure of the machinery (the
    rendezvous port taken) is run again on a fresh port, up to ``INFRASTRUCTURE_RETRIES``
    times (``infrastructure_retries`` counts them; the timings cover every attempt). No rank
    process outlives this call.
    """
    started_at, started = utc_now(), time.perf_counter()
    retries = 0
    while True:
        reservation = reserve("127.0.0.1")
        try:
            result, outcomes = _run_once(spec, f"tcp://127.0.0.1:{reservation.port}")
        finally:
            reservation.close()
        result = replace(result, started_at=started_at, infrastructure_retries=retries)
        result = result.with_timings(total_s=time.perf_counter() - started)
        cause = infrastructure_failure(outcomes.values())
        if cause is None:
            return result
        if retries == INFRASTRUCTURE_RETRIES:
            return infrastructure_result(result, cause.error or "", retries)
        retries += 1


def _run_once(
    spec: ExperimentSpec, init_method: str
) -> tuple[ExperimentResult, dict[int, RankOutcome]]:
    """One attempt at ``spec``, meeting at ``init_method``; its result and what each rank
    reported."""
    started_at, started = utc_now(), time.perf_counter()
    context = mp.get_context("spawn")
    reports: mp.Queue[RankOutcome] = context.Queue()
    with _rank_environment(spec.cpus_per_rank):
        processes = [
            context.Process(
                target=_rank_main,
                args=(spec, rank, init_method, reports),
                name=f"autotune-{spec.name}-rank{rank}",
                daemon=True,
            )
            for rank in range(spec.world_size)
        ]
        try:
            for process in processes:
                process.start()
        except Exception as err:  # e.g. an unpicklable spec: a failed experiment, not a crash
            _stop([p for p in processes if p.pid is not None])
            return ExperimentResult(
                name=spec.name,
                status=Status.error,
                error=f"RankStartError: {type(err).__name__}: {err}",
                started_at=started_at,
                timings=Timings(total_s=time.perf_counter() - started),
            ), {}

    outcomes: dict[int, RankOutcome] = {}
    deadline = started + spec.timeout_s
    try:
        while len(outcomes) < spec.world_size:
            now = time.perf_counter()
            if now >= deadline:
                break
            try:
                outcome = reports.get(timeout=min(0.2, deadline - now))
                outcomes[outcome.rank] = outcome
                if outcome.status is not Status.ok:
                    # Peers of a failed rendezvous wait in it for nothing: no grace for them.
                    grace_s = 0.0 if outcome.infrastructure else FAILURE_GRACE_S
                    deadline = min(deadline, time.perf_counter() + grace_s)
                continue
            except queue.Empty:
                pass
            for rank, process in enumerate(processes):
                if rank not in outcomes and not process.is_alive() and process.exitcode != 0:
                    outcomes[rank] = _died(rank, process.exitcode)
                    deadline = min(deadline, time.perf_counter() + FAILURE_GRACE_S)
    finally:
        _stop(processes)
        reports.close()

    verdict = experiment_verdict(spec, outcomes, started_at, time.perf_counter() - started)
    return verdict, outcomes


def _rank_main(
    spec: ExperimentSpec, rank: int, init_method: str, reports: mp.Queue[RankOutcome]
) -> None:
    from autotune.runner.rank import run_rank

    _die_with_parent()
    reports.put(run_rank(spec, rank, init_method))


def _die_with_parent() -> None:
    """Linux: if the driver is killed (even with -9), its rank processes go with it."""
    with contextlib.suppress(OSError, AttributeError):
        pr_set_pdeathsig = 1
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(pr_set_pdeathsig, signal.SIGKILL)
    parent = mp.parent_process()
    if parent is not None and os.getppid() != parent.pid:
        os._exit(1)  # the driver died before the signal was armed: it will never come


def _died(rank: int, exitcode: int | None) -> RankOutcome:
    """The outcome of a rank process seen to end without a report, while the runner waits."""
    status = Status.error
    if exitcode in _SIGKILL_EXIT_CODES:
        # This runner sends SIGKILL only after its verdict (_stop), so this one came from
        # outside: on a training machine that is almost always the kernel's OOM killer.
        status, cause = Status.oom, "killed by SIGKILL, most likely the kernel's OOM killer"
    elif exitcode is not None and exitcode < 0:
        cause = f"killed by {signal.Signals(-exitcode).name}"
    else:
        cause = f"exit code {exitcode}"
    return RankOutcome(
        rank=rank,
        status=status,
        error=f"RankDied: rank {rank} process ended without a report ({cause})",
        failed_at=time.time(),
    )


def _stop(processes: Sequence[mp.process.BaseProcess]) -> None:
    for process in processes:
        if process.is_alive():
            process.kill()
    for process in processes:
        process.join(timeout=5)


def _rank_environment(cpus_per_rank: int) -> contextlib.AbstractContextManager[None]:
    """Spawned ranks inherit this environment: one rank's threads fit its cores."""
    return entries_set(
        os.environ, {name: str(cpus_per_rank) for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")}
    )
