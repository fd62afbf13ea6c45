"""Which queued job starts when, each in a process of its own, and stopping them.

Jobs start in submission order, one at a time unless the cluster has room: where ranks hold
GPUs, the next job starts while the GPUs the running jobs' ranks hold leave room for its own;
without GPUs, never two at once, since jobs whose experiments share cores measure each other
(as the tuning loop runs one experiment at a time for the same reason). Ray places each job's
ranks; the queue only decides when a job starts. The first queued job that does not fit
waits, and so do the jobs behind it: none overtakes another.

Each job is a child process (:mod:`autotune.service.worker`), started by this module's one
thread, so that it dies with the service (its parent-death signal is bound to that thread).
It gets the service's environment less its secrets (:func:`job_environment`); the storage's
URL comes on its standard input, never in its environment.

A job that has started no experiment within the service's startup limit is stuck (a workload
that hangs at import, ranks the cluster never places): its process is asked where it is
(its stack, which :func:`autotune.service.worker.where_it_hung` reads), killed with all it
started, and the job ends ``failed`` saying where it hung; the next job starts.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from autotune.defaults import DEFAULT_WORLD_SIZE
from autotune.service import worker
from autotune.service.queue import CANCELLED, FAILED, QUEUED, RUNNING, Job, JobQueue
from autotune.service.requests import JobRequest
from autotune.service.settings import ServiceSettings, without_secrets

# A cancelled job has this long to stop its experiments (as Ctrl-C does) before it is killed.
CANCEL_GRACE_S = 30.0
POLL_S = 0.5
# How long a stuck job's process has to write its stack before it is killed all the same.
STACK_WAIT_S = 2.0


@dataclass
class _Child:
    job_id: str
    process: subprocess.Popen[bytes]
    log: IO[bytes]
    gpus: float
    interrupted_at: float | None = None
    started_at: float = field(default_factory=time.monotonic)


@dataclass
class Scheduler:
    """Starts queued jobs, notices how they end, stops cancelled ones.

    Attributes:
        settings: the service's.
        queue: the job queue.
        cluster_gpus: the GPUs of the cluster jobs run on (0: none, or no Ray).
        ray_address: the Ray cluster a job's experiments run on (None: no Ray).
    """

    settings: ServiceSettings
    queue: JobQueue
    cluster_gpus: Callable[[], float] = lambda: 0.0
    ray_address: str | None = None
    _children: dict[str, _Child] = field(default_factory=dict)
    _wake: threading.Event = field(default_factory=threading.Event)
    _stopping: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="autotune-scheduler", daemon=True)
        self._thread.start()

    def wake(self) -> None:
        """Look at the queue now (a job was added or cancelled)."""
        self._wake.set()

    def stop(self) -> None:
        """Stop the running jobs, leaving them to resume when the service starts again."""
        self._stopping.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=CANCEL_GRACE_S + 10)

    # --- the loop -------------------------------------------------------------------------------

    def _loop(self) -> None:
        while not self._stopping.is_set():
            self._reap()
            self._cancel()
            self._fail_stuck()
            self._start_next()
            self._wake.wait(POLL_S)
            self._wake.clear()
        self._stop_children()

    def _reap(self) -> None:
        """Jobs whose process ended: one that ended without saying how it did failed."""
        for job_id, child in list(self._children.items()):
            code = child.process.poll()
            if code is None:
                continue
            child.log.close()
            del self._children[job_id]
            job = self.queue.get(job_id)
            if job is None or job.status != RUNNING:
                continue  # it recorded how it ended
            if job.cancel_requested:
                self.queue.finish(job_id, CANCELLED, error="cancelled")
            else:
                self.queue.finish(
                    job_id,
                    FAILED,
                    error=f"the job's process ended (exit code {code}) without a result; "
                    f"its log: {Path(str(job.results_dir)) / LOG_NAME}",
                )

    def _cancel(self) -> None:
        """A cancelled running job gets SIGINT (it stops as Ctrl-C stops a run), then, if it
        has not ended within the grace, SIGKILL with everything it started."""
        for child in self._children.values():
            if child.interrupted_at is None:
                job = self.queue.get(child.job_id)
                if job is not None and job.cancel_requested:
                    child.process.send_signal(signal.SIGINT)
                    child.interrupted_at = time.monotonic()
            elif time.monotonic() - child.interrupted_at > CANCEL_GRACE_S:
                _kill_group(child.process)

    def _fail_stuck(self) -> None:
        """A job whose process has started no experiment within the startup limit fails,
        saying where it hung; its process and all it started are killed."""
        limit = self.settings.startup_limit_s
        for job_id, child in list(self._children.items()):
            if child.interrupted_at is not None or time.monotonic() - child.started_at < limit:
                continue
            job = self.queue.get(job_id)
            if job is None or job.status != RUNNING or job.experiment_started_at is not None:
                continue
            where = _where_it_hung(child, Path(str(job.results_dir)) / LOG_NAME)
            _kill_group(child.process)
            child.process.wait()
            child.log.close()
            del self._children[job_id]
            self.queue.finish(
                job_id,
                FAILED,
                error=f"no experiment started within {limit:g} s (the service's "
                f"--startup-limit): it hung {where}",
            )

    def _start_next(self) -> None:
        for job in self.queue.with_status(QUEUED):
            request = JobRequest.model_validate(job.request)
            gpus = (request.world_size or DEFAULT_WORLD_SIZE) * (
                request.gpus_per_rank if request.gpus_per_rank is not None else 1.0
            )
            if not self._fits(gpus):
                return  # it waits, and so does every job behind it
            results_dir = self.settings.jobs_dir.resolve() / f"{request.label()}-{job.id}"
            if not self.queue.start(job.id, str(results_dir), pid=None):
                continue  # cancelled meanwhile
            self._spawn(job, results_dir, gpus)

    def _fits(self, gpus: float) -> bool:
        if not self._children:
            return True
        total = self.cluster_gpus() if self.settings.runner == "ray" else 0.0
        if total <= 0:
            return False  # experiments sharing cores would measure each other
        held = sum(child.gpus for child in self._children.values())
        return held + gpus <= total

    def _spawn(self, job: Job, results_dir: Path, gpus: float) -> None:
        results_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        log = _private_log(results_dir / LOG_NAME)
        command = [
            sys.executable,
            "-m",
            "autotune.service.worker",
            "--state-dir",
            str(self.settings.state_dir.resolve()),
            "--job",
            job.id,
            "--parent-pid",
            str(os.getpid()),
        ]
        process = subprocess.Popen(
            command,
            stdin=subprocess.PIPE,
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=self.settings.state_dir.resolve(),
            env={
                **job_environment(self.settings),
                worker.RUNNER_ENV: self.settings.runner,
                worker.RAY_ADDRESS_ENV: self.ray_address or "",
                worker.ROOTS_ENV: os.pathsep.join(str(r) for r in self.settings.allowed_roots),
                worker.ALLOW_INSTALLED_ENV: "1" if self.settings.allow_installed_modules else "",
                worker.PROFILES_ENV: str(self.settings.profiles_dir.resolve()),
            },
            start_new_session=True,  # its own group: a kill reaches the ranks it started
            umask=0o077,  # what the job and its ranks write is the service owner's alone
        )
        # The storage's URL (its password with it) on stdin: an environment is inherited by
        # every rank and shown to whoever reads /proc; a pipe is read once.
        assert process.stdin is not None
        with contextlib.suppress(BrokenPipeError):  # it died at once: reaped as failed
            process.stdin.write(self.settings.storage_url.encode() + b"\n")
        with contextlib.suppress(BrokenPipeError):
            process.stdin.close()
        self.queue.set_pid(job.id, process.pid)
        self._children[job.id] = _Child(job.id, process, log, gpus)

    def _stop_children(self) -> None:
        """SIGTERM: each job stops its experiments and stays ``running``, to resume."""
        for child in self._children.values():
            child.process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + CANCEL_GRACE_S
        for child in self._children.values():
            try:
                child.process.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                _kill_group(child.process)
                child.process.wait()
            child.log.close()
        self._children.clear()


LOG_NAME = "job.log"


def job_environment(settings: ServiceSettings) -> dict[str, str]:
    """The environment a job's process starts with: the service's, less its secrets (the
    token, anything holding the storage's password), with the autotune this service runs
    first on the import path (a checkout, not another install)."""
    import autotune

    package_root = str(Path(autotune.__file__).resolve().parent.parent)
    environment = without_secrets(os.environ, settings.secret_values)
    path = environment.get("PYTHONPATH", "")
    environment["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, path) if p)
    return environment


def _where_it_hung(child: _Child, log_path: Path) -> str:
    """Where a stuck job's process is: its stack, which it writes to its log when signalled
    (its main thread's, even one stuck in C code), read back."""
    start = log_path.stat().st_size
    with contextlib.suppress(ProcessLookupError):
        child.process.send_signal(worker.STACK_SIGNAL)
    deadline = time.monotonic() + STACK_WAIT_S
    stack = ""
    while time.monotonic() < deadline:
        time.sleep(0.1)
        with log_path.open("rb") as log:
            log.seek(start)
            stack = log.read().decode(errors="replace")
        if worker.stack_complete(stack):
            break
    return worker.where_it_hung(stack)


def _private_log(path: Path) -> IO[bytes]:
    """The job's log, for appending, readable by the service's owner only."""
    return open(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600), "ab")


def _kill_group(process: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError):  # it ended meanwhile
        os.killpg(process.pid, signal.SIGKILL)
