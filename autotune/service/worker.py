"""One job, in a process of its own: ``python -m autotune.service.worker --state-dir D --job ID``.

The service starts one such process per running job, so that a job that crashes, hangs in
its start or is cancelled never takes the service down. It does what ``autotune run`` does,
through :func:`autotune.api.tune`, into the job's results directory under the state
directory and the service's storage, from what earlier jobs on this hardware taught
(:mod:`autotune.service.knowledge`); then it records what it learned and how it ended.

Signals: SIGINT (the service's cancel) stops the job as Ctrl-C stops a run: the experiments
in flight are cancelled and the job ends ``cancelled``. SIGTERM (the service shutting down)
stops it the same way but leaves it ``running``, to resume when the service starts again.
:data:`STACK_SIGNAL` writes every thread's stack to the job's log (``faulthandler``: even a
thread stuck in C code), for the service to say where a stuck job hung
(:func:`where_it_hung`). The process dies with the service (Linux's parent-death signal): a
``kill -9`` of the service leaves no job running that the next service would not know of.

The storage's URL comes on standard input, and is opened without its password, which this
process's database connections are given as they connect
(:func:`autotune.service.settings.lend_password`): neither the job's environment (every rank
inherits it) nor its files (``study.json``) hold the password.
"""

from __future__ import annotations

import argparse
import ctypes
import faulthandler
import inspect
import json
import os
import re
import signal
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from autotune.service import knowledge
from autotune.service.queue import CANCELLED, FAILED, SUCCEEDED, Job, JobQueue, utc_now
from autotune.service.requests import JobRequest, placement, tuning_job, user_workload_root
from autotune.service.settings import QUEUE_NAME, lend_password

if TYPE_CHECKING:
    import optuna

    from autotune.job import TuningJob
    from autotune.metric import Metric
    from autotune.tuner.warm_start import WarmStart
    from autotune.tuning import TuningEvent, TuningReport

# How the service tells a job's process where things are (the storage URL, which may hold a
# password, comes on standard input instead).
RUNNER_ENV = "AUTOTUNE_SERVICE_RUNNER"
RAY_ADDRESS_ENV = "AUTOTUNE_SERVICE_RAY_ADDRESS"
ROOTS_ENV = "AUTOTUNE_SERVICE_ROOTS"
ALLOW_INSTALLED_ENV = "AUTOTUNE_SERVICE_ALLOW_INSTALLED"  # "1": -m of installed modules
PROFILES_ENV = "AUTOTUNE_SERVICE_PROFILES"
STACK_SIGNAL = signal.SIGUSR1
# A job resumed after a kill waits this long for the killed process's lock to go.
LOCK_WAIT_S = 60.0


class ServiceStopping(BaseException):
    """SIGTERM: the service is stopping; the job resumes when it starts again."""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m autotune.service.worker")
    parser.add_argument("--state-dir", type=Path, required=True)
    parser.add_argument("--job", required=True)
    parser.add_argument("--parent-pid", type=int, required=True)
    args = parser.parse_args(argv)
    _die_with(args.parent_pid)
    signal.signal(signal.SIGTERM, _stopping)
    faulthandler.register(STACK_SIGNAL, file=sys.stderr, all_threads=True)
    storage_url = _read_storage_url()
    queue = JobQueue(args.state_dir / QUEUE_NAME)
    job = queue.get(args.job)
    if job is None or job.results_dir is None:
        print(f"no running job {args.job} in {args.state_dir}", file=sys.stderr)
        return 2
    try:
        status = JobRun(queue, job, lend_password(storage_url)).run()
    except ServiceStopping:
        print("the service is stopping: the job resumes when it starts again", file=sys.stderr)
        return 143
    return 0 if status == SUCCEEDED else 1


class JobRun:
    """One start of a job (a resumed job is started again, from its study)."""

    def __init__(self, queue: JobQueue, job: Job, storage_url: str) -> None:
        self.queue = queue
        self.job = job
        self.request = JobRequest.model_validate(job.request)
        self.results_dir = Path(str(job.results_dir))
        self.storage_url = storage_url
        self._study: optuna.Study | None = None
        self._metric: Metric | None = None  # what the job ranks by, once it is loaded
        self._limit: int | None = None  # its per-rank memory budget

    def run(self) -> str:
        """Run the job to its end; how it ended (``succeeded``, ``failed``, ``cancelled``)."""
        from autotune.config import ConfigError
        from autotune.results import ResultsDirError, ResultsLockedError
        from autotune.runner.deepspeed_engine import DeepSpeedUnavailable
        from autotune.script_target import ScriptError
        from autotune.workloads import WorkloadError

        bad_input = (
            ConfigError,
            ScriptError,
            WorkloadError,
            ResultsDirError,
            ResultsLockedError,
            DeepSpeedUnavailable,
        )
        try:
            self._enter_cwd()
            self._check_code()
            return self._run()
        except KeyboardInterrupt:  # the service's cancel
            self.queue.finish(self.job.id, CANCELLED, error="cancelled")
            return CANCELLED
        except bad_input as err:
            return self._failed(str(err))
        except ServiceStopping:
            raise
        except Exception as err:  # the job's failure, not the service's: recorded, logged
            traceback.print_exc()
            return self._failed(f"{type(err).__name__}: {err}")

    def _run(self) -> str:
        from autotune.api import tune

        hardware = knowledge.this_hardware()
        job = tuning_job(self.request, self.results_dir, self.storage_url, _roots())
        self._metric, self._limit = job.config.autotuning.metric, job.memory_budget
        key = knowledge.job_key(job, hardware.id, placement(self.request))
        self.queue.note(self.job.id, key=key)
        storage = _storage(self.storage_url)
        if not self.request.force and (answer := self._answer(key, storage)) is not None:
            return answer
        warm = self._warm_start(job, hardware.id, storage)
        _wait_for_lock(self.results_dir)
        runner = os.environ.get(RUNNER_ENV, "ray")
        report = tune(
            **self.request.tune_kwargs(),
            results_dir=str(self.results_dir),
            storage=self.storage_url,
            runner=runner,
            ray_address=os.environ.get(RAY_ADDRESS_ENV) if runner == "ray" else None,
            on_event=self._on_event,
            warm_start=warm,
        )
        return self._finished(report, key, hardware, job)

    # --- before: the same job answered, or what earlier jobs taught -----------------------------

    def _answer(self, key: str, storage: optuna.storages.BaseStorage) -> str | None:
        """A job with this key already answered (one that ran while this one queued, or
        another service's in the same storage): this one is answered from it."""
        earlier = self.queue.answered(key)
        if earlier is not None and earlier.id != self.job.id:
            best, source, command = earlier.best, earlier.id, earlier.command
        elif (entry := knowledge.answer_for(storage, key)) is not None:
            best, source, command = entry["best"], entry["job"], entry.get("command")
        else:
            return None
        self.queue.finish(
            self.job.id, SUCCEEDED, best=best, command=command, cached_from=source, experiments=0
        )
        print(f"answered from job {source}, which ran the same job", file=sys.stderr)
        return SUCCEEDED

    def _warm_start(
        self, job: TuningJob, hardware: str, storage: optuna.storages.BaseStorage
    ) -> WarmStart | None:
        """What earlier jobs on this hardware taught, chosen at the job's first start and kept
        with it: a resumed job replays its study with the same prior it began with."""
        from autotune.tuner.warm_start import WarmStart

        kept = self.job.warm_start
        if kept is None:
            engine = job.config.autotuning.engine.value
            warm, said = knowledge.warm_start(
                knowledge.entries(storage),
                hardware,
                engine,
                knowledge.model_size(job),
                job.world_size,
            )
            kept = {**said, "cost_model": warm.cost_model if warm is not None else None}
            self.queue.note(self.job.id, warm_start=kept)
        if not kept.get("cost_model") and not kept.get("answers"):
            return None
        return WarmStart(
            cost_model=kept.get("cost_model"),
            answers=tuple(kept.get("answers") or ()),
        )

    # --- during: the figures, live ----------------------------------------------------------

    def _on_event(self, event: TuningEvent) -> None:
        from autotune.tuning import EventKind

        if event.kind in (EventKind.started, EventKind.finished):
            running = [candidate.name for candidate in event.running]
            self.queue.progress(self.job.id, running, started=event.kind is EventKind.started)
        if event.kind is EventKind.finished and event.result is not None:
            result = event.result
            measured = result.metrics.throughput if result.metrics is not None else None
            said = f", {measured:.4g} samples/s" if measured is not None else ""
            print(f"finished {result.name}: {result.status.value}{said}", flush=True)
            self._draw()
        elif event.kind is EventKind.started and event.candidate is not None:
            print(f"started {event.candidate.name}", flush=True)
        elif event.kind is EventKind.resumed:
            print(f"resumed: {event.summary.num_run} experiment(s) kept", flush=True)
        elif event.kind is EventKind.waiting and event.wait_s is not None:
            print(f"the machine is busy: waiting up to {event.wait_s:.0f} s", flush=True)

    def _draw(self, predicted: dict[str, float] | None = None) -> None:
        """The study's figures from what finished so far. A figure that cannot be drawn
        costs the job nothing: it is said in the job's log and the job goes on."""
        from autotune.service.figures import update_figures

        try:
            study = self.study()
            if study is not None and self._metric is not None:
                update_figures(study, self.results_dir, self._metric, self._limit, predicted)
        except Exception as err:
            print(f"warning: the job's figures were not drawn: {err}", file=sys.stderr)

    def study(self) -> optuna.Study | None:
        if self._study is None:
            from autotune.results.study import RunStudy

            self._study = RunStudy(self.results_dir).load()
        return self._study

    # --- after: what it learned -------------------------------------------------------------

    def _finished(
        self, report: TuningReport, key: str, hardware: knowledge.HardwareId, job: TuningJob
    ) -> str:
        summary = report.summary
        experiments = summary.num_run
        if summary.best is None or report.optimal_config_path is None:
            from autotune.summary_text import stopped_line

            return self._failed(f"no experiment ran ok; {stopped_line(summary)}", experiments)
        from autotune.service.figures import predictions

        finished_at = utc_now()
        best = {
            "name": summary.best.name,
            "value": summary.best.value,
            "metric": summary.metric.value,
            "ds_config": json.loads(report.optimal_config_path.read_text()),
        }
        command = report.command or report.train_with
        study = self.study()
        if study is not None:
            knowledge.record(
                study,
                {
                    "job": self.job.id,
                    "key": key,
                    "hardware": hardware.id,
                    "device": hardware.device,
                    "engine": job.config.autotuning.engine.value,
                    "metric": summary.metric.value,
                    "world_size": job.world_size,
                    "num_params": knowledge.model_size(job) or _measured_size(report, job),
                    "label": job.label,
                    "best": best,
                    "best_overrides": dict(summary.best_overrides),
                    "cost_model": dict(summary.cost_model) if summary.cost_model else None,
                    "command": command,
                    "finished_at": finished_at,
                },
            )
        if summary.cost_model:
            profiles = Path(os.environ.get(PROFILES_ENV) or self.results_dir.parent)
            knowledge.write_profile(
                profiles, hardware, summary.cost_model, job.memory_budget, self.job.id, finished_at
            )
        self._draw(predictions(self.results_dir))
        print(f"answer: {summary.best.name}; optimal config: {report.optimal_config_path}")
        self.queue.finish(
            self.job.id, SUCCEEDED, best=best, command=command, experiments=experiments
        )
        return SUCCEEDED

    def _failed(self, error: str, experiments: int | None = None) -> str:
        print(f"error: {error}", file=sys.stderr)
        self.queue.finish(self.job.id, FAILED, error=error, experiments=experiments)
        return FAILED

    def _enter_cwd(self) -> None:
        """A script runs in its ``cwd``; a user workload imports from its allowed root (the
        ranks take the driver's working directory and import path)."""
        if self.request.cwd is not None:
            os.chdir(self.request.cwd)
            return
        root = user_workload_root(self.request.workload, _roots())
        if root is not None:
            os.chdir(root)

    def _check_code(self) -> None:
        """What the job runs of its own resolves inside the allowed roots, here, as this
        process will import it (the service asked the same when the job was submitted; a
        root may have changed since): a ``-m`` script's module (unless the service runs
        installed ones), a user workload's module and the function it names.

        Raises:
            WorkloadError: it resolves outside them.
        """
        from autotune.service.imports import import_problem, is_inside
        from autotune.workloads import WorkloadError

        roots, script = _roots(), self.request.script
        if script is not None:
            if script[0] == "-m" and os.environ.get(ALLOW_INSTALLED_ENV) != "1":
                problem = import_problem(script[1], [os.getcwd(), *sys.path], roots)
                if problem is not None:
                    raise WorkloadError(f"script -m {script[1]}: {problem}")
            return
        if user_workload_root(self.request.workload, roots) is None:
            return  # a built-in
        from autotune.workloads.registry import find_factory

        module = self.request.workload.partition(":")[0]
        problem = import_problem(module, [*sys.path, os.getcwd()], roots)
        if problem is not None:
            raise WorkloadError(f"workload {self.request.workload!r}: {problem}")
        defined_in = _defining_file(find_factory(self.request.workload))
        if defined_in is None or not is_inside(defined_in, roots):
            raise WorkloadError(
                f"workload {self.request.workload!r}: the function it names is defined in "
                f"{defined_in or 'no file (built into Python)'}, outside the allowed roots"
            )


def _roots() -> tuple[Path, ...]:
    return tuple(Path(p) for p in os.environ.get(ROOTS_ENV, "").split(os.pathsep) if p)


def _defining_file(function: Callable[..., Any]) -> str | None:
    """The file that defines ``function`` (a partial's function's), None for one built into
    Python."""
    while hasattr(function, "func"):  # functools.partial
        function = function.func
    try:
        return inspect.getfile(function)
    except TypeError:
        return None


def _read_storage_url() -> str:
    """The storage's URL, the service's first line on standard input, which is then closed
    (nothing the job runs reads it)."""
    url = sys.stdin.readline().strip()
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    return url


# --- where a stuck job hung -------------------------------------------------------------------

# What a frame of the job's main thread says it was doing, the innermost that says first.
_DOING = (
    ("autotune/workloads/registry.py", "_import_module", "importing the workload's module"),
    ("autotune/script_target.py", "_module_file", "finding the script's module"),
    ("autotune/workloads/", "", "building the workload"),
    ("autotune/service/knowledge.py", "model_size", "building the workload"),
    ("autotune/profiling/", "", "profiling the model"),
    ("autotune/service/worker.py", "_wait_for_lock", "waiting for its results' lock"),
    ("/ray/", "", "on Ray (starting it, or waiting for its ranks to be placed)"),
    ("autotune/runner/", "", "starting its ranks"),
    ("autotune/service/worker.py", "_answer", "looking up an earlier answer"),
    ("/optuna/", "", "opening its study"),
    ("/sqlalchemy/", "", "opening its study"),
    ("autotune/tuner/", "", "choosing its first experiment"),
    ("autotune/", "", "starting its run"),
)
_FRAME = re.compile(r'^\s*File "(?P<file>[^"]+)", line (?P<line>\d+) in (?P<function>\S+)')
_MAIN_THREAD_END = "_run_module_as_main"


def stack_complete(dump: str) -> bool:
    """Whether ``dump`` (what the log gained since :data:`STACK_SIGNAL`) holds the main
    thread's whole stack, which ``faulthandler`` writes last."""
    return _MAIN_THREAD_END in dump


def where_it_hung(dump: str) -> str:
    """Where the job's main thread is, from the stacks ``faulthandler`` wrote: what it was
    doing and its innermost line of code (and, where that is a library's, the innermost of
    the job's own or autotune's that called it), on one line.

    Example:
        >>> where_it_hung('''
        ... Current thread 0x1 (most recent call first):
        ...   File "/srv/code/slow.py", line 3 in <module>
        ...   File "<frozen importlib._bootstrap>", line 241 in _call_with_frames_removed
        ...   File "/x/autotune/workloads/registry.py", line 60 in _import_module
        ...   File "<frozen runpy>", line 198 in _run_module_as_main
        ... ''')
        "importing the workload's module (at /srv/code/slow.py, line 3, in <module>)"
    """
    threads = [b for b in re.split(r"\n(?=\S)", dump) if "most recent call first" in b]
    main = next((b for b in threads if _MAIN_THREAD_END in b), threads[-1] if threads else "")
    frames = [m for m in map(_FRAME.match, main.splitlines()) if m is not None]
    if not frames:
        return "where, its process did not say (it wrote no stack)"
    doing = next(
        (
            said
            for frame in frames
            for path, function, said in _DOING
            if path in frame["file"] and function in ("", frame["function"])
        ),
        "starting",
    )
    code = [frame for frame in frames if not frame["file"].startswith("<")] or frames
    own = next((frame for frame in code if not _is_library(frame["file"])), None)
    called = f", called from {_at(own)}" if own is not None and own is not code[0] else ""
    return f"{doing} (at {_at(code[0])}{called})"


def _at(frame: re.Match[str]) -> str:
    return f"{frame['file']}, line {frame['line']}, in {frame['function']}"


def _is_library(file: str) -> bool:
    """Whether ``file`` is Python's own or an installed package's."""
    import sysconfig

    return "-packages/" in file or file.startswith(sysconfig.get_paths()["stdlib"])


def _storage(url: str) -> optuna.storages.BaseStorage:
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    return optuna.storages.get_storage(url)


def _measured_size(report: TuningReport, job: TuningJob) -> int | None:
    """A script's model size, as its experiments measured it."""
    from autotune.job import measured_model_info
    from autotune.results import ResultsDir

    info = measured_model_info(ResultsDir(report.results_dir).results(), job.world_size)
    return int(info.num_params) if info is not None else None


def _wait_for_lock(results_dir: Path) -> None:
    """Wait for a killed process of this job to be gone (its lock with it): the kernel drops
    the lock as the process dies, which may take a moment after the service that owned it."""
    from autotune.results import DirectoryLock, ResultsLockedError

    if not results_dir.exists():
        return
    deadline = time.monotonic() + LOCK_WAIT_S
    while True:
        try:
            with DirectoryLock(results_dir):
                return
        except ResultsLockedError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def _die_with(parent_pid: int) -> None:
    """SIGKILL this process when the service's thread that started it ends (Linux), and exit
    now if the service is already gone."""
    if sys.platform.startswith("linux"):
        pr_set_pdeathsig = 1
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(pr_set_pdeathsig, signal.SIGKILL)
    if os.getppid() != parent_pid:
        sys.exit(1)


def _stopping(signum: int, frame: Any) -> None:
    raise ServiceStopping()


if __name__ == "__main__":
    sys.exit(main())
