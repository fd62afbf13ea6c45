"""What ``autotune run`` does, from Python: :func:`tune` for a notebook or a script.

The command line is a front over this module (as Ray Tune's ``tuner.py`` is over its
``tuner_internal.py``): :class:`RunRequest` holds what the user asked, as given;
:func:`make_job` turns it into a checked :class:`~autotune.job.TuningJob` (the config read
and overridden, loaded at the world size, the script found once); :func:`make_runner` starts
what runs the experiments; :func:`autotune.tuning.tune` runs the job to the end. Errors are
raised, never turned into exits: that is the command line's part.

A run does :func:`make_job` in two halves: the config (cheap) is loaded first, so that a bad
one fails before anything starts; the rest of the job is checked (torch imported, the
workload run on the meta device: seconds) while the runner starts (Ray: seconds too), see
:func:`started_runner`.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager as ContextManager
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

from autotune import interrupts
from autotune.config import ConfigError, load_config, parse_size, read_json, set_key
from autotune.defaults import DEFAULT_CONFIG, DEFAULT_WORLD_SIZE, default_results_dir
from autotune.profiling.interference import CpuSample, sample_cpu
from autotune.run_options import RunOptions, options_of, split_options

if TYPE_CHECKING:
    import optuna

    from autotune.job import TuningJob
    from autotune.profiling.model_info import ModelInfo
    from autotune.script_target import ScriptTarget
    from autotune.tuner.warm_start import WarmStart
    from autotune.tuning import TuningEvent, TuningReport


@dataclass(frozen=True)
class RunRequest:
    """What a run is asked (its :class:`~autotune.run_options.RunOptions`, as given: nothing
    read or checked yet), and what the caller knows of its start.

    Attributes:
        options: the run's options. Their config: a JSON file, a dict, or None: the built-in
            one (:data:`autotune.defaults.DEFAULT_CONFIG`, its results in the default
            directory; in script mode, the file the script's ``--deepspeed_config`` names).
        started_s: the ``time.monotonic()`` reading ``autotuning.time_budget_s`` counts from.
        started_cpu: the node's CPU accounting then (:func:`~autotune.profiling.interference.
            sample_cpu`): whether a neighbour was busy before the run's first experiment.
        names: how the caller spells each input in an error message (the command line: its
            flags): a key of ``autotuning`` (``"--time-budget"``), ``"device_memory"`` or
            ``"config"``. An override named here is named by it with its value; one not named
            is left to the key path the error names.
        workload_dir: the folder a user workload's package is looked for in beside the
            import path (default: the working directory, where the ranks look too).
    """

    options: RunOptions = field(default_factory=RunOptions)
    started_s: float | None = None
    started_cpu: CpuSample | None = None
    names: Mapping[str, str] = field(default_factory=dict)
    workload_dir: Path | None = None

    @cached_property
    def overrides(self) -> dict[str, Any]:
        """The ``autotuning`` keys set, as JSON holds them; the built-in config's results go
        to the default directory unless one is set."""
        given = self.options.autotuning()
        options = self.options
        if options.config is None and not options.script and "results_dir" not in given:
            given["results_dir"] = str(default_results_dir())
        return given


def read_config(config: str | Path | Mapping[str, Any] | None) -> dict[str, Any]:
    """The config as written, free to edit: a JSON file's, a copy of a dict's, or a copy of the
    built-in one (None).

    Raises:
        ConfigError: the file is missing, unreadable or not JSON.
    """
    if config is None:
        return copy.deepcopy(DEFAULT_CONFIG)
    if isinstance(config, Mapping):
        return copy.deepcopy(dict(config))
    if Path(config).suffix in (".yaml", ".yml"):
        from autotune.script_target import yaml_config_advice

        raise ConfigError("", yaml_config_advice(config), str(config))
    return read_json(config)


def make_job(request: RunRequest) -> TuningJob:
    """The job ``request`` asks for, checked as far as it can be before anything runs (an
    experiment takes seconds): the config, the workload (a forward on the meta device), the
    results directory, the engine. :func:`load_job`, then :func:`autotune.job.check_job`.

    Raises:
        ScriptError: the script cannot be found, or names no config and none is given.
        ConfigError: the config, an override or the device memory breaks a rule; named by
            where it came from (see :func:`attributed`).
        WorkloadError: the workload spec or its arguments are unusable.
        ResultsDirError / ResultsLockedError: the results directory cannot be used.
        DeepSpeedUnavailable: the job measures on DeepSpeed, and none usable is installed.
    """
    from autotune.job import check_job

    job = load_job(request)
    check_job(job)
    return job


def load_job(request: RunRequest) -> TuningJob:
    """The job ``request`` asks for, its config loaded and checked, and what else is refused in
    a moment (a fraction of a second: no torch, unless workload arguments are given as
    ``key=value`` strings): a results path that cannot hold results, a user workload's package
    that is nowhere; :func:`autotune.job.check_job` checks the rest.

    Raises:
        ScriptError: the script cannot be found, or names no config and none is given.
        ConfigError: the config, an override or the device memory breaks a rule; named by
            where it came from (see :func:`attributed`).
        WorkloadError: the workload's package cannot be found.
        ResultsDirError: the results path is a file, or not writable.
    """
    from autotune.job import TuningJob
    from autotune.results import ResultsDir
    from autotune.script_target import ScriptTarget
    from autotune.workloads.args import check_workload_package

    # The script first: its arguments (or its launch) may name the config and the world size.
    options = request.options
    target = ScriptTarget.from_command(options.script) if options.script else None
    config_file = _config_file(request, target)
    world_size = options.world_size or (target and target.world_size) or DEFAULT_WORLD_SIZE
    try:
        source = config_file if config_file is not None else options.config
        spec = read_config(target.launch_config() if source is None and target else source)
        if target is not None:
            spec = target.with_launch_settings(spec)
        for key, value in request.overrides.items():
            set_key(spec, f"autotuning.{key}", value)
        config = load_config(spec, world_size=world_size)
    except ConfigError as err:
        raise attributed(err, request, target) from None
    device_memory_bytes = _device_memory_bytes(request)
    job = TuningJob(
        config=config,
        workload=options.workload,
        workload_args=dict(options.workload_args),
        device_memory_bytes=device_memory_bytes,
        overwrite=options.overwrite or config.autotuning.overwrite,
        cpus_per_rank=options.cpus_per_rank,
        script=target.with_arg_mappings(config.autotuning.arg_mappings or {}) if target else None,
        started_s=request.started_s,
        started_cpu=request.started_cpu,
    )
    if target is None:
        check_workload_package(job.workload, request.workload_dir)
    ResultsDir.check_path(job.results_path)
    return job


def attributed(
    err: ConfigError, request: RunRequest, script: ScriptTarget | None = None
) -> ConfigError:
    """``err`` naming where the bad value came from, as ``autotune validate`` does: the
    override that set it, by the caller's name for it (``--time-budget -5.0``), else the
    config file (``script``'s, in script mode without one given)."""
    if err.source:
        return err
    for key, value in request.overrides.items():
        if err.key_path.startswith(f"autotuning.{key}"):
            name = request.names.get(key)
            return err.with_source(f"{name} {value}") if name else err
    config_file = _config_file(request, script)
    if config_file is None and request.options.config is None and script is not None:
        return err.with_source(script.config_label())
    return err.with_source(str(config_file)) if config_file is not None else err


def make_runner(
    kind: str = "ray",
    ray_address: str | None = None,
    gpus_per_rank: float | None = None,
    job: TuningJob | None = None,
) -> ContextManager[Any]:
    """What runs the experiments, as a context manager that shuts it down: ``"ray"``, warm
    actors on the Ray cluster at ``ray_address`` (None: one started here, or
    ``RAY_ADDRESS``'s); ``"local"``, fresh processes per experiment.

    Given the ``job``, the runner starts what its first experiment runs on before returning
    (:meth:`~autotune.runner.ray_runner.RayRunner.prestart`: the actors,
    :meth:`~autotune.runner.local.LocalRunner.prestart`: the server ranks fork from): it
    starts while the caller goes on.
    """
    from autotune.runner import LocalRunner

    if kind == "local":
        local = LocalRunner()
        if job is not None:
            local.prestart()
        return contextlib.nullcontext(local)
    if kind != "ray":
        raise ValueError(f"runner {kind!r}: expected 'ray' or 'local'")
    from autotune.runner.ray_runner import RayRunner

    runner = RayRunner(address=ray_address, gpus_per_rank=gpus_per_rank)
    if job is not None:
        runner.prestart(job.world_size, job.cpus_per_rank, job.config.autotuning.engine)
    return runner


@contextlib.contextmanager
def started_runner(
    job: TuningJob,
    start: Callable[[], ContextManager[Any]],
    on_checked: Callable[[ModelInfo | None], None] | None = None,
) -> Iterator[Any]:
    """The runner ``start()`` makes (e.g. ``partial(make_runner, "ray", job=job)``), entered,
    while ``job`` is checked (:func:`autotune.job.check_job`) on a thread of its own: both
    take seconds (Ray's start; torch's import, the workload's meta-device forward and its
    profile), and two cores do them at once. The runner is shut down if the check fails.
    ``on_checked`` runs on the checking thread as soon as the check has passed, with the
    workload's profile (to say that the run goes on, while the runner may still be starting).

    The check, not Ray, goes to the thread: Ray binds the processes it starts to the thread
    that starts them (Linux's parent-death signal), so they would die with a thread that
    ends. The thread is always waited for, whatever happens: one still importing torch as
    the interpreter exits aborts it. Ctrl-C meanwhile takes effect once both are done (see
    :func:`autotune.interrupts.deferred`); a second one at once.

    Raises:
        WorkloadError, ResultsDirError, ResultsLockedError, DeepSpeedUnavailable: as
            :func:`autotune.job.check_job`.
    """
    from autotune.job import check_job

    failed: list[BaseException] = []

    def check() -> None:
        try:
            info = check_job(job)
            if on_checked is not None:
                on_checked(info)
        except BaseException as err:  # raised again in the caller's thread, below
            failed.append(err)

    checking = threading.Thread(target=check, name="autotune-check-job", daemon=True)
    with contextlib.ExitStack() as stack:
        with interrupts.deferred():
            checking.start()
            try:
                runner = stack.enter_context(start())
            finally:
                checking.join()
        if failed:
            raise failed[0]  # the runner is shut down on the way out
        yield runner


def tune(
    config: str | Path | Mapping[str, Any] | None = None,
    *,
    runner: str = "ray",
    ray_address: str | None = None,
    on_event: Callable[[TuningEvent], None] | None = None,
    warm_start: WarmStart | None = None,
    sampler: optuna.samplers.BaseSampler | None = None,
    **options: Any,
) -> TuningReport:
    """Tune, as ``autotune run`` does: run (or resume) experiments, rank them, write
    ``ds_config_optimal.json`` and the summary into the results directory.

    Args:
        config: a DeepSpeed-style config: a JSON file, a dict, or None: the built-in one.
        runner: ``"ray"`` (warm actors) or ``"local"`` (fresh processes); started here and
            shut down before this returns, whatever happens.
        ray_address: an existing Ray cluster (None: ``RAY_ADDRESS``, else one started here).
        on_event: called as each experiment starts and finishes (a progress display).
        warm_start: what earlier runs on the same hardware taught (``model_based``): their
            fitted cost model and their answers (:class:`autotune.tuner.warm_start.WarmStart`).
        sampler: any Optuna sampler (``optuna.samplers.TPESampler(seed=0)``, a GP, CMA-ES,
            your own) to search with instead of the tuner type's; every experiment is still
            a trial of the run's study, re-measurement and the stopping rules still apply.
        **options: ``autotune run``'s options, by their names in
            :class:`~autotune.run_options.RunOptions` (``workload="mlp"``,
            ``workload_args={...}``, ``world_size=2``, ``device_memory="16GiB"``,
            ``script=[...]``, ``metric="latency"``, ``num_trials=10``, ``cpus_per_rank=1``,
            ``max_concurrent=2``, ``results_dir="runs/a"``, ``overwrite=True``, ...), and any
            key of the config's ``autotuning`` section (``tuner_type="gridsearch"``,
            ``time_budget_s=600``), over the config's values; None leaves one to the config.

    Returns:
        The report: the summary (``report.summary.best`` is None when no experiment ran ok),
        the results directory and the optimal config's path.

    Raises:
        ConfigError, ScriptError, WorkloadError, ResultsDirError, ResultsLockedError,
        DeepSpeedUnavailable: the input cannot run (see :func:`make_job`); a bad option or
        config before the runner starts, the rest while it starts (it is shut down first),
        and a config that leaves nothing to search once it has.
        KeyboardInterrupt: finished experiments are kept; the same call resumes.

    Example::

        from autotune.api import tune

        report = tune(
            "ds_config.json", workload="mlp", world_size=2, metric="latency",
            results_dir="runs/mlp", runner="local",
        )
        print(report.summary.best, report.optimal_config_path)
    """
    given, settings = split_options(RunOptions, {k: v for k, v in options.items() if v is not None})
    request = RunRequest(
        options=options_of(RunOptions, config=config, settings=settings, **given),
        started_s=time.monotonic(),
        started_cpu=sample_cpu(),
    )
    start = functools.partial(make_runner, runner, ray_address, request.options.gpus_per_rank)
    return run(request, start, on_event=on_event, warm_start=warm_start, sampler=sampler)


def run(
    request: RunRequest,
    start_runner: Callable[[TuningJob], ContextManager[Any]],
    *,
    on_event: Callable[[TuningEvent], None] | None = None,
    on_checked: Callable[[TuningJob], None] | None = None,
    on_report: Callable[[TuningReport], None] | None = None,
    warm_start: WarmStart | None = None,
    sampler: optuna.samplers.BaseSampler | None = None,
) -> TuningReport:
    """Run ``request`` to the end: the one chain :func:`tune` and ``autotune run`` go through.

    The config is loaded first (a bad one fails before anything starts); the rest of the job
    is checked while ``start_runner(job)`` starts what runs the experiments
    (:func:`started_runner`), which is shut down before this returns, whatever happens.

    Args:
        request: what the run is asked.
        start_runner: the runner for the job, as a context manager (see :func:`make_runner`).
        on_event: called as each experiment starts and finishes (a progress display).
        on_checked: called once the job is checked, while the runner may still be starting
            (to say the run goes on).
        on_report: called with the report before the runner shuts down (a cluster takes a
            while to stop; the answer is ready).
        warm_start, sampler: as for :func:`tune`.

    Raises:
        as :func:`tune`: every input error named by where it came from.
    """
    from autotune import tuning

    job = load_job(request)
    profiled: list[ModelInfo | None] = []

    def checked(info: ModelInfo | None) -> None:
        profiled.append(info)
        if on_checked is not None:
            on_checked(job)

    try:
        with started_runner(job, functools.partial(start_runner, job), checked) as runner:
            concurrent = request.options.max_concurrent
            report = tuning.tune(
                job, runner, on_event, concurrent, warm_start, sampler, profiled[0]
            )
            if on_report is not None:
                on_report(report)
    except ConfigError as err:  # the job's check, or a config that leaves nothing to search
        raise attributed(err, request, job.script) from None
    return report


def _config_file(request: RunRequest, script: ScriptTarget | None) -> Path | str | None:
    """The file the config comes from: the one given, else the one the script's arguments
    name; None for a dict or the built-in config.

    Raises:
        ScriptError: script mode, and no config anywhere.
    """
    from autotune.script_target import ScriptError

    if isinstance(request.options.config, str | Path):
        return request.options.config
    if script is None or request.options.config is not None:
        return None
    found = script.config_path()
    if found is None and script.launch_config() is None:
        config = request.names.get("config", "config=...")
        raise ScriptError(
            f"script mode needs a config: pass {config}, or --deepspeed_config / --deepspeed "
            "in the script's arguments (deepspeed=FILE or deepspeed: in a LLaMA-Factory YAML; "
            "or start it with accelerate launch and a DeepSpeed YAML)"
        )
    return Path(found) if found is not None else None


def _device_memory_bytes(request: RunRequest) -> int | None:
    if request.options.device_memory is None:
        return None
    try:
        return parse_size(request.options.device_memory)
    except ValueError as err:
        raise ConfigError(
            "", str(err), request.names.get("device_memory", "device_memory")
        ) from None
