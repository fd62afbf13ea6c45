"""Run one experiment as ``world_size`` fresh local processes (gloo on CPU, NCCL on GPUs).

The simplest runner: what tests and a single machine without Ray use. Each experiment gets
processes of its own. On CPU they fork from a server process that imported torch and
autotune's rank code once (multiprocessing's forkserver), so that an experiment does not
pay seconds of imports per rank before a training that may take less; with GPUs they are
spawned, fresh interpreters, since a process forked after anything asked CUDA about the
devices cannot use them. The Ray runner keeps its rank processes warm instead.
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import multiprocessing as mp
import multiprocessing.connection as mp_connection
import os
import signal
import time
from collections.abc import Mapping, Sequence
from dataclasses import replace
from functools import lru_cache
from typing import Any

from autotune import interrupts
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
from autotune.runner.process import PortReserver, free_port, reserve_port, utc_now

# How a process killed by SIGKILL ends: -9 from multiprocessing, 128 + 9 through a shell.
_SIGKILL_EXIT_CODES = (-signal.SIGKILL.value, 128 + signal.SIGKILL.value)


class LocalRunner:
    """Runs experiments one at a time on this machine, each in fresh rank processes.

    Args:
        reserve_port: how the rendezvous port is held (tests inject a collision).
    """

    def __init__(self, reserve_port: PortReserver = reserve_port) -> None:
        self._reserve_port = reserve_port

    def prestart(self) -> None:
        """Start the server the ranks fork from now, in the background, while the caller
        goes on (its imports take seconds, which the first experiment would otherwise wait
        for). Nothing on a machine with NVIDIA devices, whose ranks are spawned; asked
        without importing torch, which the caller is likely importing on another thread."""
        if rank_start_method(1 if os.path.exists("/dev/nvidiactl") else 0) == "forkserver":
            from multiprocessing import forkserver

            _rank_context("forkserver")
            forkserver.ensure_running()

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


def rank_start_method(gpus: int) -> str:
    """How rank processes start on a machine with ``gpus`` visible: ``"forkserver"`` on CPU
    (see the module docstring), ``"spawn"`` with GPUs or where fork does not exist."""
    if gpus > 0 or "forkserver" not in mp.get_all_start_methods():
        return "spawn"
    return "forkserver"


def run_local(
    spec: ExperimentSpec, reserve: PortReserver = reserve_port, start_method: str | None = None
) -> ExperimentResult:
    """Run ``spec`` on ``spec.world_size`` new processes with a wall-clock limit.

    A rank that raises, runs out of memory, dies or outlives ``spec.timeout_s`` gives a result
    with status ``error`` / ``oom`` / ``timeout``; a rank process killed by SIGKILL (most
    likely the kernel's OOM killer) gives ``oom``. A failure of the machinery (the
    rendezvous port taken) is run again on a fresh port, up to ``INFRASTRUCTURE_RETRIES``
    times (``infrastructure_retries`` counts them; the timings cover every attempt). No rank
    process outlives this call. ``start_method``: multiprocessing's, ``"spawn"`` or
    ``"forkserver"`` (default: :func:`rank_start_method` for this machine).
    """
    context = _rank_context(start_method or rank_start_method(visible_gpus()))
    started_at, started = utc_now(), time.perf_counter()
    retries = 0
    while True:
        reservation = reserve("127.0.0.1")
        try:
            result, outcomes = _run_once(spec, f"tcp://127.0.0.1:{reservation.port}", context)
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


def _rank_context(start_method: str) -> mp.context.BaseContext:
    context = mp.get_context(start_method)
    if start_method == "forkserver":
        # The server imports what ranks need once, as it starts (once per process; later
        # calls change nothing), for every rank forked from it.
        context.set_forkserver_preload(["autotune.runner.warm_fork"])
    return context


def _run_once(
    spec: ExperimentSpec, init_method: str, context: mp.context.BaseContext
) -> tuple[ExperimentResult, dict[int, RankOutcome]]:
    """One attempt at ``spec``, meeting at ``init_method``, its ranks started by
    ``context``; its result and what each rank reported.

    Each rank reports on a pipe of its own rather than a shared ``multiprocessing.Queue``:
    a queue's locks are named semaphores that the child opens by name as it starts, so a
    driver stopped (Ctrl-C) while a rank was starting removed them under it, and the rank
    printed a traceback into the user's terminal. A pipe's ends travel with the start.
    """
    started_at, started = utc_now(), time.perf_counter()
    pipes = [context.Pipe(duplex=False) for _ in range(spec.world_size)]
    processes = [
        context.Process(  # type: ignore[attr-defined]
            target=_rank_main,
            args=(spec, rank, init_method, sender, _rank_environment(spec.cpus_per_rank)),
            name=f"autotune-{spec.name}-rank{rank}",
            # Not a daemon: multiprocessing forbids a daemon process children of its own, which a
            # script's data loader workers are. Every rank is stopped below whatever happens,
            # and dies with the driver (see _die_with_parent).
            daemon=False,
        )
        for rank, (_, sender) in enumerate(pipes)
    ]
    listening = [receiver for receiver, _ in pipes]
    outcomes: dict[int, RankOutcome] = {}
    try:
        try:
            # Ctrl-C meanwhile waits for every start's pid, which the stop below needs.
            with interrupts.deferred():
                for process, (_, sender) in zip(processes, pipes, strict=True):
                    process.start()
                    sender.close()  # the rank holds it now: its end shows as the pipe's EOF
        except Exception as err:  # e.g. an unpicklable spec: a failed experiment, not a crash
            return ExperimentResult(
                name=spec.name,
                status=Status.error,
                error=f"RankStartError: {type(err).__name__}: {err}",
                started_at=started_at,
                timings=Timings(total_s=time.perf_counter() - started),
            ), {}
        deadline = started + spec.timeout_s
        while len(outcomes) < spec.world_size:
            now = time.perf_counter()
            if now >= deadline:
                break
            ready = mp_connection.wait(listening, timeout=min(0.2, deadline - now))
            for receiver in [receiver for receiver in listening if receiver in ready]:
                listening.remove(receiver)
                with contextlib.suppress(EOFError):  # it ended without a word: seen below
                    outcome: RankOutcome = receiver.recv()
                    outcomes[outcome.rank] = outcome
                    if outcome.status is not Status.ok:
                        # Peers of a failed rendezvous wait in it for nothing: no grace then.
                        grace_s = 0.0 if outcome.infrastructure else FAILURE_GRACE_S
                        deadline = min(deadline, time.perf_counter() + grace_s)
            for rank, process in enumerate(processes):
                if rank not in outcomes and not process.is_alive() and process.exitcode != 0:
                    outcomes[rank] = _died(rank, process.exitcode)
                    deadline = min(deadline, time.perf_counter() + FAILURE_GRACE_S)
    finally:
        _stop([process for process in processes if process.pid is not None])
        for receiver, sender in pipes:
            receiver.close()
            sender.close()

    verdict = experiment_verdict(spec, outcomes, started_at, time.perf_counter() - started)
    return verdict, outcomes


def _rank_main(
    spec: ExperimentSpec,
    rank: int,
    init_method: str,
    report: mp_connection.Connection,
    environment: Mapping[str, str],
) -> None:
    from autotune.runner.rank import run_rank

    _die_with_parent()
    # What the process holds from the start (a forked rank: torch and all the server
    # imported) is never this experiment's garbage: the collections after it skip it.
    gc.freeze()
    # The driver's environment as it is now: a forked rank would otherwise have the one
    # the forkserver started with.
    os.environ.clear()
    os.environ.update(environment)
    report.send(run_rank(spec, rank, init_method))
    report.close()


def _die_with_parent() -> None:
    """Linux: if the driver is killed (even with -9), its rank processes go with it. A
    spawned rank's parent is the driver; a forked one's is the forkserver, which exits as
    soon as the driver is gone (once the rank lets it: :func:`_release_the_server`)."""
    with contextlib.suppress(OSError, AttributeError):
        pr_set_pdeathsig = 1
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(pr_set_pdeathsig, signal.SIGKILL)
    driver = mp.parent_process()
    if driver is None or driver.pid is None or os.getppid() == driver.pid:
        return
    _release_the_server()
    try:
        os.kill(driver.pid, 0)  # forked: the driver still runs, and the server with it
    except ProcessLookupError:
        os._exit(1)  # the driver died before the signal was armed: it will never come


def _release_the_server() -> None:
    """Close this forked rank's copy of the driver's end of the pipe that keeps the
    forkserver alive. Every child of the server gets one, so the server lives until the
    driver and all its children are gone; a rank holding it kept the server, and with it
    its own parent-death signal, alive after the driver's kill -9 (seen: a rank of a killed
    run still waiting in its rendezvous 13 minutes on). The attribute is multiprocessing's
    own; a server that starts later in this process (a script's loader using forkserver)
    makes a new one."""
    from multiprocessing import forkserver

    server: Any = forkserver._forkserver
    with contextlib.suppress(AttributeError, OSError, TypeError):
        os.close(server._forkserver_alive_fd)
    with contextlib.suppress(AttributeError):
        server._forkserver_alive_fd = None


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


def _rank_environment(cpus_per_rank: int) -> dict[str, str]:
    """A rank's environment: the driver's, with one rank's threads fitting its cores."""
    threads = str(cpus_per_rank)
    return {**os.environ, "OMP_NUM_THREADS": threads, "MKL_NUM_THREADS": threads}
