"""The tuning loop: the tuner proposes, a runner runs, the results directory remembers.

This is the one place the three meet. Resuming is replaying: the tuner is made on the run's
study and replays its trials before it is asked for anything, so a finished experiment is
never run again and an interrupted one (its trial still running) is proposed again first.

With a runner that runs several experiments at once (:class:`ConcurrentRunner`), the loop
keeps every free slot busy: it asks the tuner as soon as a slot opens, and records each result
the moment it finishes, so a crash loses only the experiments in flight. Where the tuner,
with nothing in flight, asks to wait for a busy machine to quiet down, the loop watches the
node's CPUs for up to that long and tells it how that went.
"""

from __future__ import annotations

import enum
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from autotune import interrupts
from autotune.config.overrides import as_client_reads
from autotune.experiment import ExperimentResult, ExperimentSpec
from autotune.job import (
    TuningJob,
    experiment_spec,
    job_hardware,
    measured_model_info,
)
from autotune.profiling.interference import leaves_room, others_cores, sample_cpu, wait_for_quiet
from autotune.results import ResultsDir
from autotune.runner.measuring_engine import measuring_engine
from autotune.summary_text import format_summary, summary_json, train_with
from autotune.tuner import Candidate, Tuner, TuningSummary
from autotune.tuner.warm_start import WarmStart

if TYPE_CHECKING:
    import optuna

    from autotune.profiling.model_info import ModelInfo


class Runner(Protocol):
    """Anything that turns an ExperimentSpec into an ExperimentResult without raising."""

    def run(self, spec: ExperimentSpec) -> ExperimentResult: ...


@runtime_checkable
class ConcurrentRunner(Protocol):
    """A runner with room for several experiments at once (the Ray runner)."""

    @property
    def uses_gpus(self) -> bool:
        """Whether each rank holds GPUs of its own (else ranks share the nodes' cores)."""
        ...

    def capacity(self, world_size: int, cpus_per_rank: int = 1) -> int:
        """How many experiments of this shape fit at once, each with its own resources."""
        ...

    def submit(self, spec: ExperimentSpec) -> None:
        """Start ``spec`` as soon as there is room; its result comes from ``wait``."""
        ...

    def wait(self) -> list[ExperimentResult]:
        """Block until a submitted experiment finishes; those finished by then."""
        ...

    def cancel(self) -> None:
        """Stop every submitted experiment, releasing its resources; no results come back."""
        ...


class EventKind(str, enum.Enum):
    """What happened: a run resumed from its results directory, an experiment started or
    finished."""

    resumed = "resumed"
    started = "started"
    finished = "finished"
    waiting = "waiting"  # for a busy machine to quiet down, up to ``TuningEvent.wait_s``


@dataclass(frozen=True)
class TuningEvent:
    """Progress, for displays: an experiment started or finished."""

    kind: EventKind
    candidate: Candidate | None
    result: ExperimentResult | None
    summary: TuningSummary
    running: tuple[Candidate, ...] = ()  # every experiment in flight after this event
    wait_s: float | None = None  # waiting: the longest it waits


@dataclass(frozen=True)
class TuningReport:
    """The end of a run: what was found and where it was written."""

    summary: TuningSummary
    results_dir: Path
    optimal_config_path: Path | None
    num_resumed: int
    num_run_now: int
    command: str | None = None  # script mode: the command that trains with the best
    train_with: str | None = None  # how to train with the best (see summary_text.train_with)


def tune(
    job: TuningJob,
    runner: Runner | ConcurrentRunner,
    on_event: Callable[[TuningEvent], None] | None = None,
    max_concurrent: int | None = None,
    warm_start: WarmStart | None = None,
    sampler: optuna.samplers.BaseSampler | None = None,
    model_info: ModelInfo | None = None,
) -> TuningReport:
    """Run (or resume) a tuning job to the end.

    Args:
        job: what to tune, and where.
        runner: runs the experiments; a :class:`ConcurrentRunner` may run several at once.
        on_event: progress callback.
        max_concurrent: experiments in flight at most (never more than fit, each with its
            own resources). Default: as many as fit where ranks hold GPUs, else 1, since
            experiments sharing cores measure each other.
        warm_start: what earlier runs on the same hardware taught (``model_based``).
        sampler: an Optuna sampler to search with instead of the tuner type's.
        model_info: the workload's profile, where the job's check made it already (None:
            profiled here; a script's model is measured by its first experiment).

    An interruption (Ctrl-C, any exception) cancels the experiments in flight and releases
    their resources before it propagates; their results are not recorded, so a resumed run
    runs them again.

    Raises:
        WorkloadError: the workload spec or its arguments are unusable (before any experiment).
        ResultsDirError / ResultsLockedError: the results directory cannot be used.
        ConfigError: the config leaves nothing to search.
    """
    # A workload's model is profiled up front; a script's is measured by its first experiment.
    info = model_info
    if info is None and job.script is None:
        from autotune.profiling.model_info import profile_workload

        info = profile_workload(job.config, job.workload, job.workload_args)
    notify = on_event or (lambda event: None)
    with ResultsDir.open(job.results_path, job.fingerprint(), overwrite=job.overwrite) as results:
        if info is None:
            info = measured_model_info(results.results(), job.world_size)
        tuner = make_tuner(job, info, results, warm_start, sampler, _busy_before_start(job))
        if tuner.num_replayed:
            notify(TuningEvent(EventKind.resumed, None, None, tuner.summary()))

        def make_spec(candidate: Candidate) -> ExperimentSpec:
            return experiment_spec(
                job,
                candidate,
                info.flops_per_sample if info is not None else None,
                output_dir=str(results.experiment_dir(candidate.name).resolve()),
            )

        def learn(result: ExperimentResult) -> None:
            # A script's model is measured by its first experiment: the FLOPs each later
            # experiment counts (the tuner reads the model's size from the study itself).
            nonlocal info
            if info is None:
                info = measured_model_info([result], job.world_size)

        run_now = _run_to_the_end(
            tuner, results, _Slots(runner, job, max_concurrent), make_spec, learn, notify
        )
        summary = tuner.summary()
        optimal = tuner.optimal_config()
        optimal_path, command, training = None, None, None
        if optimal is not None:
            optimal_path = results.write_optimal(optimal_as_read(job, summary, optimal))
            command = training_command(job, optimal, optimal_path)
            if command is not None:
                results.write_command(command)
            training = train_with(job, optimal_path, command)
        results.write_summary(
            summary_json(summary, optimal_path, command),
            format_summary(summary, optimal_path, job, command),
        )
    return TuningReport(
        summary, job.results_path, optimal_path, tuner.num_replayed, run_now, command, training
    )


def optimal_as_read(
    job: TuningJob, summary: TuningSummary, optimal: Mapping[str, Any]
) -> dict[str, Any]:
    """The best config as it is trained with: for a script, in the form its client reads it
    (the user's ``"auto"`` values kept for the HF Trainer or Accelerate to fill in)."""
    if job.script is None:
        return dict(optimal)
    overrides = job.script.left_to_client(job.config.spec, summary.best_overrides)
    return as_client_reads(job.config.spec, overrides, optimal)


def training_command(job: TuningJob, optimal: Mapping[str, Any], optimal_path: Path) -> str | None:
    """The command that trains the tuned script with the best config on the engine that
    measured it (None for a workload: its training script is the user's own)."""
    if job.script is None:
        return None
    from autotune.deepspeed.launcher import training_command as script_command

    launcher = measuring_engine(job.config.autotuning.engine).launcher(job.world_size)
    return script_command(job.script, optimal, optimal_path, launcher, job.world_size)


def _run_to_the_end(
    tuner: Tuner,
    results: ResultsDir,
    slots: _Slots,
    make_spec: Callable[[Candidate], ExperimentSpec],
    on_result: Callable[[ExperimentResult], None],
    notify: Callable[[TuningEvent], None],
) -> int:
    """Keep every free slot busy until the tuner is done; the number of experiments run.

    A slot is filled the moment it frees; each result's files are written as soon as it
    arrives, then it is told to the tuner (its trial's tell is the commit point) and to
    ``on_result``. ``ask`` returning None with experiments in flight means "wait for a
    result", so the loop waits for one and asks again.
    """
    run_now = 0
    in_flight: dict[str, tuple[ExperimentSpec, Candidate]] = {}

    def running() -> tuple[Candidate, ...]:
        return tuple(candidate for _, candidate in in_flight.values())

    try:
        # A Ctrl-C whose KeyboardInterrupt Python dropped (see interrupts.kept) stops the
        # run as the loop comes round.
        with interrupts.kept() as deliver_lost:
            while True:
                deliver_lost()
                while len(in_flight) < slots.count() and (candidate := tuner.ask()) is not None:
                    spec = make_spec(candidate)
                    results.start(spec)
                    slots.runner.submit(spec)
                    in_flight[spec.name] = (spec, candidate)
                    notify(
                        TuningEvent(EventKind.started, candidate, None, tuner.summary(), running())
                    )
                if not in_flight:
                    wait_s = tuner.quiet_wait_s
                    if wait_s is None:  # the tuner asks for nothing and waits for nothing: done
                        return run_now
                    notify(
                        TuningEvent(EventKind.waiting, None, None, tuner.summary(), wait_s=wait_s)
                    )
                    started = time.monotonic()
                    quiet = wait_for_quiet(wait_s, slots.job.rank_cores)
                    tuner.machine_quiet(quiet, time.monotonic() - started)
                    continue
                for result in slots.runner.wait():
                    spec, candidate = in_flight.pop(result.name)
                    results.save(spec, result)
                    tuner.tell(result)
                    run_now += 1
                    on_result(result)
                    notify(
                        TuningEvent(
                            EventKind.finished, candidate, result, tuner.summary(), running()
                        )
                    )
    except BaseException:
        slots.runner.cancel()  # Ctrl-C or a crash: stop what runs, free its resources
        raise


class _OneAtATime:
    """A plain :class:`Runner` behind the concurrent interface: each ``wait`` runs the next
    submitted experiment to its end."""

    uses_gpus = False

    def __init__(self, runner: Runner) -> None:
        self._runner = runner
        self._queued: list[ExperimentSpec] = []

    def capacity(self, world_size: int, cpus_per_rank: int = 1) -> int:
        return 1

    def submit(self, spec: ExperimentSpec) -> None:
        self._queued.append(spec)

    def wait(self) -> list[ExperimentResult]:
        return [self._runner.run(self._queued.pop(0))] if self._queued else []

    def cancel(self) -> None:
        self._queued.clear()


class _Slots:
    """How many experiments may be in flight now: asked again after every result, so a node
    that leaves the cluster (or joins it) changes how many run."""

    def __init__(
        self,
        runner: Runner | ConcurrentRunner,
        job: TuningJob,
        max_concurrent: int | None,
    ) -> None:
        if max_concurrent is not None and max_concurrent < 1:
            raise ValueError(f"max_concurrent must be at least 1, got {max_concurrent}")
        self.runner: ConcurrentRunner = (
            runner if isinstance(runner, ConcurrentRunner) else _OneAtATime(runner)
        )
        self.job = job
        self._max_concurrent = max_concurrent

    def count(self) -> int:
        if self._max_concurrent is None and not self.runner.uses_gpus:
            return 1  # experiments sharing cores would measure each other
        fits = self.runner.capacity(self.job.world_size, self.job.cpus_per_rank)
        # At least one: a gang that does not fit yet waits for room (or fails placement).
        return max(1, min(fits, self._max_concurrent or fits))


def make_tuner(
    job: TuningJob,
    info: ModelInfo | None,
    results: ResultsDir,
    warm_start: WarmStart | None = None,
    sampler: optuna.samplers.BaseSampler | None = None,
    busy_before_start: bool | None = None,
) -> Tuner:
    """A tuner for ``job`` on the run's study in ``results``, which it replays first (see
    :class:`~autotune.tuner.tuner.Tuner`)."""
    tuning = job.config.autotuning
    study = results.study(
        tuning.metric,
        tuning.storage,
        {"target": job.label, "engine": tuning.engine.value},
    )
    return Tuner(
        job.config,
        info,
        device_memory_bytes=job.memory_budget,
        study=study,
        started=job.started_s,
        hardware=job_hardware(),
        warm_start=warm_start,
        sampler=sampler,
        busy_before_start=busy_before_start,
    )


def _busy_before_start(job: TuningJob) -> bool | None:
    """Whether other processes held this node's cores between the job's start and now (its
    cluster's start and its check, before any experiment); None: not known."""
    if job.started_cpu is None or (now := sample_cpu()) is None:
        return None
    others = others_cores(job.started_cpu, now)
    if others is None or now.at_s - job.started_cpu.at_s < 1.0:
        return None  # too short a look to say
    return not leaves_room(others, job.rank_cores, now.node_cores)
