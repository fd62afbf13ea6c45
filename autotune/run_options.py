"""What a tuning run is asked, each option declared once: :class:`TuningOptions`.

``autotune run``'s flags, ``autotune submit``'s, a service job's fields
(:class:`~autotune.service.requests.JobRequest`) and :func:`autotune.api.tune`'s keywords are
the fields below, with their rules (types, ranges) and their help: the command line is made
from them (:mod:`autotune.cli_options`), a request is validated by them. Where the front ends
differ, a model adds its own: :class:`RunOptions` for a run on this machine (its config file,
results directory, storage), the service's ``JobRequest`` for a job (its config as data, its
working directory).

Torch-free and Ray-free: the command line reads it before anything starts.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, TypeVar

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
    ValidationError,
    field_validator,
)
from pydantic.fields import FieldInfo

from autotune.config import ConfigError, EngineName, Metric, TunerType
from autotune.config.autotuning import MAX_SEED
from autotune.defaults import DEFAULT_CPUS_PER_RANK, DEFAULT_WORKLOAD

MAX_ARG_CHARS = 4096
_IDENTIFIER = r"[A-Za-z_]\w*"
Arg = Annotated[str, Field(max_length=MAX_ARG_CHARS)]
# A JSON number a run can use: not Infinity or NaN (which JSON itself does not have, and
# which would be stored as null), an int within what torch and NumPy take.
Finite = Annotated[float, Field(allow_inf_nan=False)]
Scalar = Arg | Annotated[int, Field(ge=-(2**63), lt=2**63)] | Finite | bool | None
ArgName = Annotated[str, StringConstraints(pattern=rf"^{_IDENTIFIER}$", max_length=128)]
# A workload argument: a JSON scalar, or a list or object of them (``-a sizes=[1,2]``).
ArgValue = (
    Scalar
    | Annotated[list[Scalar], Field(max_length=256)]
    | Annotated[dict[ArgName, Scalar], Field(max_length=256)]
)


def option(
    default: Any,
    help: str,
    *,
    flags: tuple[str, ...] = (),
    autotuning: str | None = None,
    cli: Any = None,
    **rules: Any,
) -> Any:
    """A field of the options: its default, its help (the command line's and the API's), the
    command line's spellings (``flags``; default: ``--field-name``), the ``autotuning`` key it
    sets (None: none), the type the command line reads it as (``cli``; default: the field's),
    and its ``rules`` (pydantic's: ``ge``, ``max_length``, ...)."""
    field = Field(default, description=help, **rules)
    field.metadata.append(OptionInfo(flags, autotuning, cli))  # pydantic leaves it be
    return field


@dataclass(frozen=True)
class OptionInfo:
    """What :func:`option` says of a field beside pydantic's rules."""

    flags: tuple[str, ...] = ()
    autotuning: str | None = None
    cli: Any = None


class TuningOptions(BaseModel):
    """The options every front end takes: what is tuned, and how it is searched and run."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    workload: str = option(
        DEFAULT_WORKLOAD,
        "gpt, mlp, hf:<model_type> (e.g. hf:bert; needs transformers), or package.module:function.",
        min_length=1,
        max_length=256,
    )
    workload_args: dict[ArgName, ArgValue] = option(
        {},
        "key=value for the workload (repeatable).",
        flags=("--workload-arg", "-a"),
        cli=list[str] | None,
        max_length=256,
    )
    world_size: int | None = option(
        None,
        "Data-parallel ranks (default: an `accelerate launch`'s num_processes, else 2).",
        flags=("--world-size", "-n"),
        ge=1,
        le=65536,
    )
    device_memory: str | int | None = option(
        None,
        "Per-rank memory budget, e.g. 16GiB (CPU default: 512MiB; with --engine deepspeed "
        "the host's RAM shared among the ranks).",
        cli=str | None,
    )
    script: list[Arg] | None = option(
        None,
        "Script mode: a training script and its arguments (or -m module ...), tuned instead "
        "of a workload.",
        min_length=1,
        max_length=512,
    )
    metric: Metric | None = option(None, "What to optimise.", autotuning="metric")
    tuner: TunerType | None = option(None, "How to search.", autotuning="tuner_type")
    engine: EngineName | None = option(
        None,
        "What measures each experiment: builtin (autotune's engine) or deepspeed (the "
        "installed DeepSpeed's own).",
        autotuning="engine",
    )
    fast: bool | None = option(
        None, "Only stages and micro-batch.", flags=("--fast/--no-fast",), autotuning="fast"
    )
    num_trials: int | None = option(
        None, "Experiments at most.", autotuning="tuner_num_trials", ge=1
    )
    early_stopping: int | None = option(
        None,
        "Experiments without a new best that end a phase.",
        autotuning="tuner_early_stopping",
        ge=1,
    )
    start_profile_step: int | None = option(
        None, "First optimizer step of the timed window.", autotuning="start_profile_step", ge=1
    )
    end_profile_step: int | None = option(
        None, "Last optimizer step of the timed window.", autotuning="end_profile_step", ge=1
    )
    timeout: Finite | None = option(None, "Seconds per experiment.", autotuning="timeout_s", ge=1)
    time_budget: Finite | None = option(
        None,
        "Seconds for the whole run, from now: nothing starts that would end past it, and the "
        "best is measured again within it.",
        autotuning="time_budget_s",
        gt=0,
    )
    seed: int | None = option(None, "Seeds the search.", autotuning="seed", ge=0, le=MAX_SEED)
    cpus_per_rank: int = option(
        DEFAULT_CPUS_PER_RANK, "Cores (torch threads) each rank gets.", ge=1, le=1024
    )
    gpus_per_rank: Finite | None = option(
        None, "Ray: GPUs per rank (default: 1 if the cluster has GPUs).", ge=0, le=64
    )
    max_concurrent: int | None = option(
        None,
        "Ray: experiments at once (default: as many as fit on the cluster's GPUs; 1 without GPUs).",
        ge=1,
    )

    @field_validator("workload_args", mode="before")
    @classmethod
    def _key_value_strings(cls, value: Any) -> Any:
        """``key=value`` strings (the command line's ``-a``) read as the arguments they say."""
        if isinstance(value, list | tuple):
            from autotune.workloads.args import parse_workload_args  # torch-free

            return parse_workload_args(list(value))
        return value

    @field_validator("script")
    @classmethod
    def _plain_arguments(cls, script: list[str] | None) -> list[str] | None:
        for arg in script or ():
            if "\x00" in arg:
                raise ValueError("an argument holds a NUL byte")
        return script

    def autotuning(self) -> dict[str, Any]:
        """The keys of the config's ``autotuning`` section these options set (an enum by its
        value, a path as text)."""
        fields = type(self).autotuning_fields().items()
        return {
            key: _as_json(getattr(self, name))
            for key, name in fields
            if getattr(self, name) is not None
        }

    @classmethod
    def autotuning_fields(cls) -> dict[str, str]:
        """The ``autotuning`` key each option sets → the option's name."""
        return {
            key: name
            for name, field in cls.model_fields.items()
            if (key := option_info(field).autotuning) is not None
        }

    @classmethod
    def autotuning_flags(cls) -> dict[str, str]:
        """The ``autotuning`` key each option sets → its long flag (how an error about the
        value names it)."""
        return {
            key: option_flags(cls, name)[0].split("/")[0]
            for key, name in cls.autotuning_fields().items()
        }


class RunOptions(TuningOptions):
    """A run on this machine (``autotune run``, :func:`autotune.api.tune`): its config file
    and where its results live, besides :class:`TuningOptions`."""

    config: str | Path | dict[str, Any] | None = option(
        None, "DeepSpeed config; default: built-in.", flags=("--config", "-c"), cli=Path | None
    )
    results_dir: str | Path | None = option(
        None, "Where results live.", autotuning="results_dir", cli=Path | None
    )
    storage: str | None = option(
        None,
        "Where the run's Optuna study goes: a database URL (sqlite:///runs/autotune.db, "
        "postgresql://...) or a journal file; default: study.journal in the results dir.",
        autotuning="storage",
    )
    overwrite: bool = option(False, "Discard earlier results.")
    settings: dict[str, Any] = option(
        {}, "Other keys of the config's autotuning section, over the config's values."
    )

    def autotuning(self) -> dict[str, Any]:
        return {**{k: _as_json(v) for k, v in self.settings.items()}, **super().autotuning()}


Options = TypeVar("Options", bound=TuningOptions)


def options_of(model: type[Options], **values: Any) -> Options:
    """``model``'s options from keywords (Python's, :func:`autotune.api.tune`'s).

    Raises:
        ConfigError: an option breaks its rule, named (``num_trials: ...``).
    """
    try:
        return model(**values)
    except ValidationError as err:
        first = err.errors()[0]
        name = ".".join(str(part) for part in first["loc"])
        raise ConfigError(name, str(first["msg"]).removeprefix("Value error, ")) from None


def option_flags(model: type[BaseModel], name: str) -> tuple[str, ...]:
    """The command line's spellings of ``model``'s option ``name``."""
    return option_info(model.model_fields[name]).flags or ("--" + name.replace("_", "-"),)


def option_info(field: FieldInfo) -> OptionInfo:
    """What :func:`option` said of a field beside pydantic's rules."""
    return next((m for m in field.metadata if isinstance(m, OptionInfo)), OptionInfo())


def split_options(
    model: type[TuningOptions], given: Mapping[str, Any]
) -> tuple[dict[str, Any], dict[str, Any]]:
    """``given`` keywords as ``model``'s options, and the rest (keys of the ``autotuning``
    section, as :func:`autotune.api.tune` takes them)."""
    fields = model.model_fields
    return (
        {k: v for k, v in given.items() if k in fields},
        {k: v for k, v in given.items() if k not in fields},
    )


def _as_json(value: Any) -> Any:
    if hasattr(value, "value") and not isinstance(value, bool | int | float | str):
        return value.value
    return str(value) if isinstance(value, Path) else value
