"""The ``autotune`` command line. It parses arguments and calls the library; no logic lives here."""

from __future__ import annotations

import atexit
import contextlib
import enum
import functools
import gc
import json
import sys
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from typer.core import TyperGroup

from autotune.cli_options import with_options
from autotune.cli_results import register as register_results_commands
from autotune.cli_service import register as register_service_commands
from autotune.config import ConfigError
from autotune.config.sizes import split_size_error
from autotune.defaults import DEFAULT_WORLD_SIZE
from autotune.run_options import RunOptions

if TYPE_CHECKING:
    from autotune.api import RunRequest
    from autotune.job import TuningJob
    from autotune.script_target import ScriptTarget
    from autotune.tuning import TuningReport

# Typer's usage errors, whether it uses click or, as recent versions do, its own copy of it.
_UsageError: type[Exception] = next(
    c for c in typer.BadParameter.__mro__ if c.__name__ == "UsageError"
)
_ARGS = "autotune.args"  # the command line as given, kept in the context for the error line


class _OneLineUsageErrors(TyperGroup):
    """Typer's group of commands, except that a bad flag, flag value or command is one line
    on stderr naming the flag and the value (exit 2), like every other bad input, instead of
    Typer's box of usage and error."""

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        ctx.meta[_ARGS] = list(args)
        with _one_line_usage_error(args):
            return super().parse_args(ctx, args)

    def invoke(self, ctx: Any) -> Any:
        with _one_line_usage_error(ctx.meta.get(_ARGS, [])):
            return super().invoke(ctx)


@contextlib.contextmanager
def _one_line_usage_error(args: list[str]) -> Iterator[None]:
    try:
        yield
    except _UsageError as err:
        if type(err).__name__ == "NoArgsIsHelpError":  # `autotune` alone: the help, as Typer's
            raise
        raise fail(usage_line(err, args)) from None


def usage_line(err: Any, args: list[str]) -> str:
    """A usage error as one line: ``--world-size 0: input should be greater than or equal to
    1``; a bad value is named by its flag (the long one) and the value as given."""
    param = getattr(err, "param", None)
    opts = [*getattr(param, "opts", ()), *getattr(param, "secondary_opts", ())]
    given = _value_given(args, opts) if opts and opts[0].startswith("-") else None
    if isinstance(err, typer.BadParameter) and given is not None:
        message = " ".join(str(err.message).split()).removeprefix("Value error, ")
        message = f"{max(opts, key=len)} {given}: {_lowercase(message)}"
    else:  # a missing argument, an unknown option or command: click's own words
        message = _lowercase(" ".join(err.format_message().split()))
    where = getattr(getattr(err, "ctx", None), "command_path", None) or "autotune"
    return f"{message.rstrip('.')} (see {where} --help)"


def _value_given(args: list[str], opts: list[str]) -> str | None:
    """The value ``args`` gave an option spelled any of ``opts`` (the last one, as it wins):
    ``--world-size 0``, ``--world-size=0`` or ``-n0``."""
    for index in range(len(args) - 1, -1, -1):
        arg = args[index]
        for opt in opts:
            if arg == opt:
                return args[index + 1] if index + 1 < len(args) else None
            if opt.startswith("--") and arg.startswith(f"{opt}="):
                return arg[len(opt) + 1 :]
            if not opt.startswith("--") and arg.startswith(opt) and len(arg) > len(opt):
                return arg[len(opt) :]
    return None


def _lowercase(message: str) -> str:
    """``Input should be ...`` → ``input should be ...``, leaving ``NCCL ...`` alone."""
    return message[:1].lower() + message[1:] if message[1:2].islower() else message


app = typer.Typer(
    name="autotune",
    help="Find the fastest ZeRO data-parallel training config for a PyTorch model.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    # Click's plain help: rich's tables cut a long flag at 80 columns (--start-profile-…);
    # plain help wraps the description instead, every flag whole.
    rich_markup_mode=None,
    cls=_OneLineUsageErrors,
)

EXIT_BAD_INPUT = 2
EXIT_NOTHING_RAN_OK = 1
EXIT_INTERRUPTED = 130


def fail(message: str) -> typer.Exit:
    """Print a one-line error and return the exit to raise (code 2: bad input)."""
    typer.echo(f"error: {message}", err=True)
    return typer.Exit(EXIT_BAD_INPUT)


@app.command()
def validate(
    config: Annotated[Path, typer.Argument(help="A DeepSpeed-style JSON config.")],
    world_size: Annotated[
        int, typer.Option("--world-size", "-n", min=1, help="Data-parallel ranks (as run's).")
    ] = DEFAULT_WORLD_SIZE,
    full: Annotated[bool, typer.Option("--full", help="Show every default too.")] = False,
) -> None:
    """Check a config and print it resolved (batch triad filled in), or the first error."""
    from autotune.config import load_config

    try:
        cfg = load_config(config, world_size=world_size)
    except ConfigError as err:
        raise fail(str(err)) from None
    typer.echo(json.dumps(cfg.to_dict(full=full), indent=2))
    if cfg.search_space:
        keys = ", ".join(f"{k} ({len(v)} values)" for k, v in cfg.search_space.items())
        typer.echo(f"search space: {keys}", err=True)
    if not isinstance(cfg.train_micro_batch_size_per_gpu, int):
        typer.echo("batch size: left to the tuner (no micro-batch fixed)", err=True)


class RunnerKind(str, enum.Enum):
    ray = "ray"
    local = "local"


# run's options that take more than a line to say
_ScriptArgument = Annotated[
    list[str] | None,
    typer.Argument(
        help="After `--`: a training script and its arguments (or -m module ...), tuned "
        "instead of a workload; its config comes from -c or its --deepspeed_config / "
        "--deepspeed argument.",
        show_default=False,
    ),
]
_ConfigOption = Annotated[
    Path | None, typer.Option("--config", "-c", help="DeepSpeed config; default: built-in.")
]
_WorkloadArgOption = Annotated[
    list[str] | None,
    typer.Option("--workload-arg", "-a", help="key=value for the workload (repeatable)."),
]


@app.command()
@with_options(RunOptions, lambda message: fail(message), exclude={"script", "settings"})
def run(
    script: _ScriptArgument = None,
    ray_address: Annotated[
        str | None, typer.Option(envvar="RAY_ADDRESS", help="An existing Ray cluster.")
    ] = None,
    runner: Annotated[
        RunnerKind, typer.Option(case_sensitive=False, help="ray: warm actors; local: fresh.")
    ] = RunnerKind.ray,
    quiet: Annotated[
        bool, typer.Option("--quiet", "-q", help="Log lines, no live display.")
    ] = False,
    *,
    options: RunOptions,
) -> None:
    """Tune: run experiments, rank them, write ds_config_optimal.json. Re-run to resume.

    Script mode: autotune run [OPTIONS] -- train.py --deepspeed ds_config.json [ARGS...]
    """
    started_s = time.monotonic()  # autotuning.time_budget_s counts the cluster's start too
    from autotune.profiling.interference import sample_cpu

    started_cpu = sample_cpu()  # was a neighbour busy before the first experiment?
    if split := split_size_error("--device-memory", options.device_memory, script):
        raise fail(split)
    from autotune.api import RunRequest, load_job
    from autotune.api import run as run_request
    from autotune.display import Progress, output_console, print_line, print_report
    from autotune.summary_text import stopped_line

    request = RunRequest(
        options=options.model_copy(update={"script": script or None}),
        started_s=started_s,
        started_cpu=started_cpu,
        names=_RUN_NAMES,
    )
    with _bad_input_exits(request, _job_errors):
        job = load_job(request)  # a bad config fails here, in a fraction of a second
    console = output_console()  # off a terminal, no line broken at 80 columns

    def header(job: TuningJob) -> None:
        print_line(
            console,
            f"autotune: tuning {job.label} at world size {job.world_size} by "
            f"{job.config.autotuning.metric.value}; results in {job.results_path}",
        )

    start = functools.partial(_make_runner, runner, ray_address, options.gpus_per_rank)
    with _bad_input_exits(request, _job_errors, _tune_errors):
        try:
            with Progress(console, quiet) as progress:

                def finished(done: TuningReport) -> None:
                    progress.stop()
                    print_report(console, done)

                report = run_request(
                    request, start, on_event=progress, on_checked=header, on_report=finished
                )
        except KeyboardInterrupt:
            typer.echo(interrupted_line(job.results_path), err=True)
            raise typer.Exit(EXIT_INTERRUPTED) from None
    if report.summary.best is None:
        # Nothing to train with: a script or pipeline calling autotune must see that.
        typer.echo(f"error: no experiment ran ok; {stopped_line(report.summary)}", err=True)
        raise typer.Exit(EXIT_NOTHING_RAN_OK)


def interrupted_line(results_path: Path) -> str:
    """What an interrupted run leaves, in words: the experiments kept in its results
    directory, or, interrupted before it made one, nothing."""
    from autotune.results import ResultsDir

    results = ResultsDir(results_path)
    if not results.is_results_dir():
        return "interrupted before the first experiment: nothing was written"
    from autotune.summary_text import counted

    try:
        kept = f"{counted(len(results.finished_names()), 'finished experiment')} kept"
    except Exception:  # an unreadable record: say what is sure
        kept = "the results are kept"
    return f"interrupted: {kept} in {results_path}; run the same command to resume"


# How run's errors name its inputs: by the flags that gave them.
_RUN_NAMES = RunOptions.autotuning_flags() | {
    "device_memory": "--device-memory",
    "config": "-c CONFIG",
}


def _job_errors() -> tuple[type[Exception], ...]:
    """What assembling a job raises for input that cannot run (see make_job)."""
    from autotune.results import ResultsDirError, ResultsLockedError
    from autotune.runner.deepspeed_engine import DeepSpeedUnavailable
    from autotune.script_target import ScriptError
    from autotune.workloads import WorkloadError

    return ScriptError, WorkloadError, ResultsDirError, ResultsLockedError, DeepSpeedUnavailable


def _tune_errors() -> tuple[type[Exception], ...]:
    """What the tuning loop raises for input that cannot run (see autotune.tuning.tune)."""
    from autotune.results import ResultsDirError, ResultsLockedError
    from autotune.workloads import WorkloadError

    return WorkloadError, ResultsDirError, ResultsLockedError


@contextlib.contextmanager
def _bad_input_exits(
    request: RunRequest,
    *kinds: Callable[[], tuple[type[Exception], ...]],
    script: ScriptTarget | None = None,
) -> Iterator[None]:
    """A config error named by the flag or file it came from, or an error of one of the
    ``kinds``, as one line and exit 2.

    The kinds are looked up only once an error is raised: the modules that define them
    import torch (a second), which a run must not wait for before it starts Ray.
    """
    from autotune.api import attributed

    try:
        yield
    except ConfigError as err:
        raise fail(str(attributed(err, request, script))) from None
    except Exception as err:
        if isinstance(err, tuple(e for kind in kinds for e in kind())):
            raise fail(str(err)) from None
        raise


class PlanFormat(str, enum.Enum):
    table = "table"
    json = "json"


@app.command()
def plan(
    config: _ConfigOption = None,
    workload: Annotated[
        str | None,
        typer.Option(
            help="As for run: gpt, mlp, hf:<model_type>, package.module:function "
            "(default: --from's, else gpt).",
            show_default=False,
        ),
    ] = None,
    workload_arg: _WorkloadArgOption = None,
    hardware: Annotated[
        str | None,
        typer.Option(
            help="A GPU from the catalog (v100-32gb, a100-40gb, a100-80gb, h100-80gb, "
            "h200-141gb) or a JSON file with the same fields.",
        ),
    ] = None,
    world_size: Annotated[
        int | None,
        typer.Option("--world-size", "-n", min=1, help="Default: --from's, else 8."),
    ] = None,
    gpus_per_node: Annotated[
        int | None, typer.Option(min=1, help="Default: the hardware's usual node.")
    ] = None,
    from_dir: Annotated[
        Path | None,
        typer.Option(
            "--from",
            help="A finished model_based run: predict with the constants it fitted, for its "
            "workload, config, world size and memory budget unless given.",
        ),
    ] = None,
    format: Annotated[PlanFormat, typer.Option("--format", "-f")] = PlanFormat.table,
    top: Annotated[
        int | None,
        typer.Option(min=1, help="Show the best N only (default: 20 in the table, all in JSON)."),
    ] = None,
) -> None:
    """Predict, without running anything, how each configuration would train on hardware
    you may not have: the ranking of the search space by the cost model, and what fits."""
    from autotune.api import read_config
    from autotune.planning import PlanRequest, make_plan
    from autotune.workloads import WorkloadError, parse_workload_args

    try:
        request = PlanRequest(
            config=read_config(config) if config is not None or from_dir is None else None,
            workload=workload,
            workload_args=parse_workload_args(workload_arg) if workload_arg else None,
            world_size=world_size,
            gpus_per_node=gpus_per_node,
            hardware=hardware,
            from_dir=from_dir,
        )
        planned = make_plan(request)
    except (ConfigError, WorkloadError) as err:
        raise fail(str(err)) from None
    if planned.unused_fit:
        typer.echo(f"warning: {planned.unused_fit}", err=True)
    if format is PlanFormat.json:
        rows = planned.rows[:top] if top else planned.rows
        typer.echo(json.dumps([row.to_dict() for row in rows], indent=2))
        return
    from autotune.display import PLAN_ROWS, print_plan

    print_plan(planned, top or PLAN_ROWS)


def _make_runner(
    kind: RunnerKind,
    ray_address: str | None,
    gpus_per_rank: float | None,
    job: TuningJob | None = None,
) -> Any:
    """The runner run starts (a name of this module's, so that a test can stand in another)."""
    from autotune.api import make_runner

    return make_runner(kind.value, ray_address, gpus_per_rank, job)


@app.command("exec", context_settings={"ignore_unknown_options": True})
def exec_(
    script: Annotated[
        list[str],
        typer.Argument(
            help="After `--`: the training script and its arguments (or -m module ...).",
            show_default=False,
        ),
    ],
    nproc: Annotated[int, typer.Option("--nproc", "-n", min=1, help="Ranks on this node.")] = 1,
) -> None:
    """Train with a script on the built-in engine, unchanged: torchrun with autotune standing
    in for DeepSpeed (a DeepSpeed script, an HF Trainer or an Accelerate loop).

    Example: autotune exec --nproc 2 -- train.py --deepspeed ds_config_optimal.json
    """
    import subprocess

    from autotune.deepspeed import SERVED_VERSION
    from autotune.deepspeed.launcher import exec_command
    from autotune.script_target import ScriptError

    try:
        command, env = exec_command(script, nproc)
    except ScriptError as err:
        raise fail(str(err)) from None
    typer.echo(
        f"autotune exec: {' '.join(script[:2] if script[:1] == ['-m'] else script[:1])} on "
        f"{nproc} rank(s), autotune's built-in ZeRO engine standing in for DeepSpeed "
        f"{SERVED_VERSION}",
        err=True,
    )
    raise typer.Exit(subprocess.call(command, env=env))


register_results_commands(app, fail)  # autotune report, autotune best
register_service_commands(app, fail)  # autotune serve, autotune submit


@app.callback()
def _group() -> None:
    """Keeps subcommands as subcommands even while only one exists."""


def main() -> None:
    """Console entry point: bad input exits 2 with one line, Ctrl-C exits 130, no tracebacks.

    Usage errors are Typer's own (exit 2); commands turn library errors into :func:`fail`.
    """
    warnings.showwarning = _one_line_warning
    # The interpreter's last garbage collection, as it exits, walks every object still alive
    # (torch's modules, the workload's model): measured 0.5-0.9 s after a run. Frozen, they
    # are skipped: the process's memory goes back all the same, and what holds a file or a
    # process is closed by then (results written, Ray shut down).
    atexit.register(gc.freeze)
    try:
        app()
    except KeyboardInterrupt:
        typer.echo("interrupted", err=True)
        sys.exit(130)


def _one_line_warning(
    message: Warning | str,
    category: type[Warning],
    filename: str,
    lineno: int,
    file: Any = None,
    line: str | None = None,
) -> None:
    """A warning on the command line is one line naming the problem, like an error, not
    Python's two lines pointing into autotune's source."""
    typer.echo(f"warning: {message}", err=True)
