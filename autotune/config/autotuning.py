"""The ``autotuning`` section: how the tuner searches, measures and ranks.

DeepSpeed's documented keys with its defaults, plus a few of autotune's own (marked below).
"""

from __future__ import annotations

import enum
from typing import Annotated, Any

from pydantic import BeforeValidator, Field, StrictBool, field_validator

from autotune.config.fields import AnyInt, NonNegativeInt, PositiveInt, Section
from autotune.metric import Metric

# The largest seed: the samplers' (NumPy's) take 32 bits, and a run derives more seeds from
# its own by adding small offsets (a phase's index, a rank's 1000 × (rank + 1)).
MAX_SEED = 2**31 - 1


class TunerType(str, enum.Enum):
    """How the search picks what to measure next (``autotune.tuner.search``, each an Optuna
    sampler of the run's study): DeepSpeed's phases with every point in order, or at random,
    or (the default) the cost model of a ZeRO step fitted to what ran."""

    gridsearch = "gridsearch"
    random = "random"
    model_based = "model_based"


class EngineName(str, enum.Enum):
    """Which engine measures each experiment: autotune's own, or the installed DeepSpeed."""

    builtin = "builtin"
    deepspeed = "deepspeed"


def _lower(value: Any) -> Any:
    return value.lower() if isinstance(value, str) else value


class AutotuningConfig(Section):
    """``autotuning``: DeepSpeed's documented keys and defaults, plus a few of autotune's own."""

    enabled: StrictBool = False
    results_dir: str = "autotuning_results"
    exps_dir: str = "autotuning_exps"
    overwrite: StrictBool = False
    metric: Annotated[Metric, BeforeValidator(_lower)] = Metric.throughput
    start_profile_step: PositiveInt = 3
    end_profile_step: PositiveInt = 5
    fast: StrictBool = True
    max_train_batch_size: PositiveInt | None = None
    min_train_batch_size: PositiveInt = 1
    max_train_micro_batch_size_per_gpu: PositiveInt = 1024
    min_train_micro_batch_size_per_gpu: PositiveInt = 1
    mp_size: PositiveInt = 1
    num_tuning_micro_batch_sizes: PositiveInt = 3
    tuner_type: Annotated[TunerType, BeforeValidator(_lower)] = TunerType.model_based
    engine: Annotated[EngineName, BeforeValidator(_lower)] = Field(
        default=EngineName.builtin,
        description="The engine each experiment is measured on: autotune's built-in ZeRO "
        "engine, or the installed DeepSpeed's own (a config is tuned for the engine that "
        "measured it).",
    )
    tuner_early_stopping: PositiveInt = 5
    tuner_num_trials: PositiveInt = 50
    arg_mappings: dict[str, str] | None = Field(
        default=None,
        description="Config key -> the training script's flag that must carry its value "
        "(script mode), e.g. train_micro_batch_size_per_gpu -> --per_device_train_batch_size.",
    )
    model_info_path: str | None = None
    # autotune's own keys (DeepSpeed has no equivalent).
    timeout_s: float = Field(default=600.0, gt=0, description="Wall-clock limit per experiment.")
    time_budget_s: float | None = Field(
        default=None,
        gt=0,
        description="The run's wall time, from the command's start: an experiment starts "
        "only if it is expected to end within it with time left to stop the cluster, and the "
        "search leaves room to re-measure its best.",
    )
    num_remeasure: NonNegativeInt = Field(
        default=3, description="Top candidates re-measured before the best is declared."
    )
    seed: Annotated[AnyInt, Field(ge=0, le=MAX_SEED)] = 0
    storage: str | None = Field(
        default=None,
        description="Where the run's Optuna study (its record: one trial per experiment) is "
        "kept: a database URL Optuna takes (sqlite:///runs/autotune.db, postgresql://...) or "
        "a journal file's path. Default: study.journal in the results directory.",
    )

    @field_validator("arg_mappings")
    @classmethod
    def _trim_arg_mappings(cls, value: dict[str, str] | None) -> dict[str, str] | None:
        # Real configs carry keys such as "train_micro_batch_size_per_gpu " (DeepSpeed trims).
        if value is None:
            return None
        return {key.strip(): flag.strip() for key, flag in value.items()}
