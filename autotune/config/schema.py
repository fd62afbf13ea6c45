"""The DeepSpeed config schema: one pydantic model per section, keys spelled as DeepSpeed does.

Sections the engine and tuner act on are typed field by field and reject unknown keys.
The other documented sections are kept as plain dicts so a config round-trips unchanged.
Defaults follow DeepSpeed's config documentation (its ``config-json`` page).
"""

from __future__ import annotations

import builtins
import enum
from typing import Annotated, Any, Literal

from pydantic import (
    AliasChoices,
    BeforeValidator,
    Field,
    StrictBool,
    field_validator,
    model_validator,
)

from autotune.config.autotuning import AutotuningConfig
from autotune.config.fields import (
    AnyInt,
    BoolOrAuto,
    Interval,
    NonNegativeFloat,
    NonNegativeFloatOrAuto,
    NonNegativeInt,
    NonNegativeIntOrAuto,
    OpenSection,
    PositiveInt,
    PositiveIntOrAuto,
    Section,
)
from autotune.config.sizes import parse_size

# --- optimizer ---------------------------------------------------------------------------------

# DeepSpeed's own optimizers; any other name must be a torch.optim class.
DEEPSPEED_OPTIMIZERS = ("Adam", "AdamW", "Lamb", "OneBitAdam", "ZeroOneAdam", "OneBitLamb")


class AdaptiveParams(Section):
    """What Adam and Lamb share: moment averaging (``betas``) and the update's ``eps``."""

    lr: NonNegativeFloatOrAuto = 1e-3
    betas: tuple[float, float] | Literal["auto"] = (0.9, 0.999)
    eps: NonNegativeFloatOrAuto = 1e-8
    weight_decay: NonNegativeFloatOrAuto = 0.0


class AdamParams(AdaptiveParams):
    amsgrad: StrictBool = False
    bias_correction: StrictBool = True
    adam_w_mode: StrictBool = True
    torch_adam: StrictBool = False
    fused: StrictBool | None = None
    foreach: StrictBool | None = None


class LambParams(AdaptiveParams):
    bias_correction: StrictBool = True
    max_coeff: NonNegativeFloat = 10.0
    min_coeff: NonNegativeFloat = 0.01
    max_grad_norm: NonNegativeFloat = 0.0


class SGDParams(Section):
    lr: NonNegativeFloatOrAuto = 1e-3
    momentum: NonNegativeFloatOrAuto = 0.0
    dampening: NonNegativeFloat = 0.0
    weight_decay: NonNegativeFloatOrAuto = 0.0
    nesterov: StrictBool = False
    maximize: StrictBool = False
    foreach: StrictBool | None = None
    fused: StrictBool | None = None


# Optimizers whose params are checked key by key (case-insensitive type names).
TYPED_OPTIMIZER_PARAMS: dict[str, type[Section]] = {
    "adam": AdamParams,
    "adamw": AdamParams,
    "lamb": LambParams,
    "sgd": SGDParams,
}


class OptimizerConfig(Section):
    """``optimizer``: a type name and the constructor's keyword arguments."""

    type: str
    params: dict[str, Any] = Field(default_factory=dict)

    @field_validator("type")
    @classmethod
    def _known_type(cls, name: str) -> str:
        if name.lower() in {n.lower() for n in DEEPSPEED_OPTIMIZERS}:
            return name
        # Only unusual names pay for importing torch.
        import torch.optim

        candidates = [
            n
            for n in dir(torch.optim)
            if isinstance(getattr(torch.optim, n), type) and n[0].isupper()
        ]
        if name in candidates:
            return name
        lowered = {n.lower(): n for n in candidates}
        if name.lower() in lowered:
            return lowered[name.lower()]
        raise ValueError(
            f"unknown optimizer {name!r}: use one of {', '.join(DEEPSPEED_OPTIMIZERS[:3])}, "
            "or a torch.optim class name"
        )

    def params_model(self) -> builtins.type[Section] | None:
        """The typed model its params are checked against, if the type has one."""
        return TYPED_OPTIMIZER_PARAMS.get(self.type.lower())


# --- scheduler ---------------------------------------------------------------------------------


class WarmupLRParams(Section):
    warmup_min_lr: NonNegativeFloatOrAuto = 0.0
    warmup_max_lr: NonNegativeFloatOrAuto = 1e-3
    warmup_num_steps: NonNegativeIntOrAuto = 1000
    warmup_type: Literal["log", "linear"] = "log"
    last_batch_iteration: AnyInt = -1


class WarmupDecayLRParams(WarmupLRParams):
    total_num_steps: PositiveIntOrAuto


class WarmupCosineLRParams(Section):
    total_num_steps: PositiveIntOrAuto
    warmup_min_ratio: NonNegativeFloat = 0.0
    warmup_num_steps: NonNegativeIntOrAuto = 1000
    cos_min_ratio: NonNegativeFloat = 1e-4
    warmup_type: Literal["log", "linear"] = "log"
    last_batch_iteration: AnyInt = -1


class OneCycleParams(Section):
    cycle_min_lr: NonNegativeFloatOrAuto
    cycle_max_lr: NonNegativeFloatOrAuto
    decay_lr_rate: NonNegativeFloat = 0.0
    cycle_first_step_size: PositiveInt = 2000
    cycle_second_step_size: PositiveInt | None = None
    cycle_first_stair_count: NonNegativeInt = 0
    cycle_second_stair_count: NonNegativeInt | None = None
    decay_step_size: NonNegativeInt = 0
    cycle_momentum: StrictBool = True
    cycle_min_mom: NonNegativeFloat = 0.8
    cycle_max_mom: NonNegativeFloat = 0.9
    decay_mom_rate: NonNegativeFloat = 0.0
    last_batch_iteration: AnyInt = -1


class LRRangeTestParams(Section):
    lr_range_test_min_lr: NonNegativeFloatOrAuto = 1e-3
    lr_range_test_step_size: PositiveInt = 2000
    lr_range_test_step_rate: NonNegativeFloat = 1.0
    lr_range_test_staircase: StrictBool = False
    last_batch_iteration: AnyInt = -1


SCHEDULER_PARAMS: dict[str, type[Section]] = {
    "WarmupLR": WarmupLRParams,
    "WarmupDecayLR": WarmupDecayLRParams,
    "WarmupCosineLR": WarmupCosineLRParams,
    "OneCycle": OneCycleParams,
    "LRRangeTest": LRRangeTestParams,
}


class SchedulerConfig(Section):
    """``scheduler``: one of DeepSpeed's LR schedules and its parameters."""

    type: Literal["WarmupLR", "WarmupDecayLR", "WarmupCosineLR", "OneCycle", "LRRangeTest"]
    params: dict[str, Any] = Field(default_factory=dict)

    def params_model(self) -> builtins.type[Section]:
        """The typed model its params are checked against."""
        return SCHEDULER_PARAMS[self.type]

    def typed_params(self) -> Any:
        """The params as their typed model, defaults filled in."""
        return SCHEDULER_PARAMS[self.type].model_validate(self.params)


# --- precision ---------------------------------------------------------------------------------


class LossScaling(Section):
    """fp16's loss-scale keys. DeepSpeed's bf16 section takes them too (DeepSpeedExamples'
    cifar config sets them there); bf16 needs no scaling, so there they change nothing."""

    enabled: BoolOrAuto = False
    loss_scale: NonNegativeFloat = 0.0
    initial_scale_power: NonNegativeInt = 16
    loss_scale_window: PositiveInt = 1000
    hysteresis: PositiveInt = 2
    consecutive_hysteresis: StrictBool = False
    min_loss_scale: NonNegativeFloat = 1.0


class FP16Config(LossScaling):
    """``fp16``: half precision with dynamic (``loss_scale`` 0) or static loss scaling."""

    auto_cast: StrictBool = False
    fp16_master_weights_and_grads: StrictBool = False


class BF16Config(LossScaling):
    """``bf16`` (also spelled ``bfloat16``): bfloat16 compute, fp32 master weights."""

    immediate_grad_update: StrictBool = False
    check_grad_overflow: StrictBool = False
    bf16_master_weights_and_grads: StrictBool = False
    bf16_optimizer_states: StrictBool = False


class AMPConfig(OpenSection):
    """``amp``: apex AMP; keys other than ``enabled`` go to ``amp.initialize``."""

    enabled: StrictBool = False


class ActivationCheckpointingConfig(OpenSection):
    """``activation_checkpointing``: DeepSpeed's keys for its own checkpointing API
    (``partition_activations``, ``cpu_checkpointing``, ...) pass through unread; ``enabled``
    is autotune's: whether the model recomputes its activations in backward, which a
    built-in or ``hf:`` workload switches on, and a script through ``autotuning.arg_mappings``
    (e.g. onto ``--gradient_checkpointing``). A list (``[false, true]``) is searched."""

    enabled: StrictBool = False


# --- ZeRO --------------------------------------------------------------------------------------


class OffloadDevice(str, enum.Enum):
    none = "none"
    cpu = "cpu"
    nvme = "nvme"


class OffloadParamConfig(Section):
    """``zero_optimization.offload_param`` (stage 3 only)."""

    device: OffloadDevice = OffloadDevice.none
    nvme_path: str | None = None
    pin_memory: StrictBool = False
    buffer_count: PositiveInt = 5
    buffer_size: PositiveInt = 100_000_000
    max_in_cpu: PositiveInt = 1_000_000_000


class OffloadOptimizerConfig(Section):
    """``zero_optimization.offload_optimizer``: optimizer state and step on the host."""

    device: OffloadDevice = OffloadDevice.none
    nvme_path: str | None = None
    pin_memory: StrictBool = False
    ratio: float = Field(default=1.0, gt=0.0, le=1.0)
    buffer_count: PositiveInt = 4
    fast_init: StrictBool = False
    pipeline_read: StrictBool = False
    pipeline_write: StrictBool = False


def _alias(name: str, *others: str) -> AliasChoices:
    return AliasChoices(name, *others)


class ZeroConfig(Section):
    """``zero_optimization``: the ZeRO stage and its knobs (sizes are element counts)."""

    stage: int = Field(default=0, ge=0, le=3)
    allgather_partitions: StrictBool = True
    allgather_bucket_size: PositiveIntOrAuto = 500_000_000
    overlap_comm: BoolOrAuto = False
    reduce_scatter: StrictBool = True
    reduce_bucket_size: PositiveIntOrAuto = 500_000_000
    contiguous_gradients: StrictBool = True
    offload_param: OffloadParamConfig | None = None
    offload_optimizer: OffloadOptimizerConfig | None = None
    stage3_max_live_parameters: PositiveIntOrAuto = Field(
        default=1_000_000_000,
        validation_alias=_alias("stage3_max_live_parameters", "max_live_parameters"),
    )
    stage3_max_reuse_distance: NonNegativeIntOrAuto = Field(
        default=1_000_000_000,
        validation_alias=_alias("stage3_max_reuse_distance", "max_reuse_distance"),
    )
    stage3_prefetch_bucket_size: NonNegativeIntOrAuto = Field(
        default=50_000_000,
        validation_alias=_alias("stage3_prefetch_bucket_size", "prefetch_bucket_size"),
    )
    stage3_param_persistence_threshold: NonNegativeIntOrAuto = Field(
        default=100_000,
        validation_alias=_alias(
            "stage3_param_persistence_threshold", "param_persistence_threshold"
        ),
    )
    stage3_gather_16bit_weights_on_model_save: BoolOrAuto = Field(
        default=False,
        validation_alias=_alias(
            "stage3_gather_16bit_weights_on_model_save",
            "stage3_gather_fp16_weights_on_model_save",
            "gather_16bit_weights_on_model_save",
        ),
    )
    stage3_module_granularity_threshold: NonNegativeInt = 0
    sub_group_size: PositiveInt = 1_000_000_000
    elastic_checkpoint: StrictBool = False
    ignore_unused_parameters: StrictBool = True
    round_robin_gradients: StrictBool = False
    load_from_fp32_weights: StrictBool = True
    use_multi_rank_bucket_allreduce: StrictBool = True
    zero_hpz_partition_size: PositiveInt = 1
    zero_quantized_weights: StrictBool = False
    zero_quantized_gradients: StrictBool = False
    zero_quantized_nontrainable_weights: StrictBool = False
    mics_shard_size: AnyInt = -1
    mics_hierarchical_params_gather: StrictBool = False
    memory_efficient_linear: StrictBool = True
    log_trace_cache_warnings: StrictBool = False
    cpu_offload: StrictBool | None = Field(
        default=None, description="Deprecated: true means offload_optimizer.device = cpu."
    )

    @model_validator(mode="before")
    @classmethod
    def _no_duplicate_aliases(cls, data: Any) -> Any:
        if isinstance(data, dict):
            for name, field in cls.model_fields.items():
                if isinstance(field.validation_alias, AliasChoices):
                    spelled = [a for a in field.validation_alias.choices if a in data]
                    if len(spelled) > 1:
                        raise ValueError(
                            f"{' and '.join(map(str, spelled))} both set {name}; keep one"
                        )
        return data

    @property
    def optimizer_offload_device(self) -> OffloadDevice:
        """Where optimizer state lives, with the deprecated ``cpu_offload`` folded in."""
        if self.offload_optimizer is not None:
            return self.offload_optimizer.device
        return OffloadDevice.cpu if self.cpu_offload else OffloadDevice.none

    @property
    def param_offload_device(self) -> OffloadDevice:
        return self.offload_param.device if self.offload_param is not None else OffloadDevice.none


# --- flops profiler and logging ----------------------------------------------------------------


class FlopsProfilerConfig(Section):
    enabled: StrictBool = False
    recompute_fwd_factor: NonNegativeFloat = 0.0
    profile_step: PositiveInt = 1
    module_depth: AnyInt = -1
    top_modules: PositiveInt = 1
    detailed: StrictBool = True
    output_file: str | None = None


# --- the whole config --------------------------------------------------------------------------

# The batch triad: any two determine the third (train = micro * accumulation * world size).
TRIAD = ("train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps")


class DeepSpeedConfig(Section):
    """A DeepSpeed-style training config's sections, validated.

    Users get the :class:`~autotune.config.Config` that :func:`~autotune.config.load_config`
    makes from it: the same sections with the batch triad resolved and the search lists kept.
    Documented sections autotune does not act on are plain dicts, kept verbatim.
    """

    train_batch_size: PositiveIntOrAuto | None = None
    train_micro_batch_size_per_gpu: PositiveIntOrAuto | None = None
    gradient_accumulation_steps: PositiveIntOrAuto | None = None
    optimizer: OptimizerConfig | None = None
    scheduler: SchedulerConfig | None = None
    gradient_clipping: NonNegativeFloatOrAuto = 0.0
    communication_data_type: Literal["fp32", "fp16", "bf16"] | None = None
    prescale_gradients: StrictBool = False
    gradient_predivide_factor: float = Field(default=1.0, gt=0)
    sparse_gradients: StrictBool = False
    fp16: FP16Config = Field(default_factory=FP16Config)
    bf16: BF16Config = Field(
        default_factory=BF16Config, validation_alias=_alias("bf16", "bfloat16")
    )
    amp: AMPConfig = Field(default_factory=AMPConfig)
    zero_optimization: ZeroConfig = Field(default_factory=ZeroConfig)
    zero_allow_untested_optimizer: StrictBool = False
    zero_force_ds_cpu_optimizer: StrictBool = True
    autotuning: AutotuningConfig = Field(default_factory=AutotuningConfig)
    flops_profiler: FlopsProfilerConfig = Field(default_factory=FlopsProfilerConfig)
    # Logging: the engine answers steps_per_print(); DeepSpeed's timer, memory and state
    # printouts have no counterpart (the profile window and the memory accounting report).
    wall_clock_breakdown: StrictBool = False
    memory_breakdown: StrictBool = False
    steps_per_print: Interval = 10
    dump_state: StrictBool = False
    disable_allgather: StrictBool = Field(
        default=False, description="Accepted without effect (engine/settings.py)."
    )
    fp32_allreduce: StrictBool = Field(
        default=False, description="Accepted without effect (engine/settings.py)."
    )
    dataloader_drop_last: StrictBool = False
    seed: AnyInt | None = None
    # autotune's own: the per-rank device-memory budget the CPU engine enforces.
    device_memory_bytes: Annotated[
        int | None, BeforeValidator(lambda v: v if v is None else parse_size(v))
    ] = None

    activation_checkpointing: ActivationCheckpointingConfig = Field(
        default_factory=ActivationCheckpointingConfig
    )
    aio: dict[str, Any] | None = None
    sparse_attention: dict[str, Any] | None = None
    data_efficiency: dict[str, Any] | None = None
    curriculum_learning: dict[str, Any] | None = None
    monitor_config: dict[str, Any] | None = None
    tensorboard: dict[str, Any] | None = None
    wandb: dict[str, Any] | None = None
    csv_monitor: dict[str, Any] | None = None
    comet: dict[str, Any] | None = None
    elasticity: dict[str, Any] | None = None
    comms_logger: dict[str, Any] | None = None
    compression_training: dict[str, Any] | None = None
    checkpoint: dict[str, Any] | None = None
    data_types: dict[str, Any] | None = None
    pipeline: dict[str, Any] | None = None
    eigenvalue: dict[str, Any] | None = None
    progressive_layer_drop: dict[str, Any] | None = None
    quantize_training: dict[str, Any] | None = None
    weight_quantization: dict[str, Any] | None = None
    hybrid_engine: dict[str, Any] | None = None
    nebula: dict[str, Any] | None = None
    tensor_parallel: dict[str, Any] | None = None

    @model_validator(mode="before")
    @classmethod
    def _one_spelling_of_bf16(cls, data: Any) -> Any:
        if isinstance(data, dict) and "bf16" in data and "bfloat16" in data:
            raise ValueError("bf16 and bfloat16 are the same section; keep one")
        return data

    @property
    def precision(self) -> Literal["fp32", "fp16", "bf16"]:
        if self.fp16.enabled is True:
            return "fp16"
        if self.bf16.enabled is True:
            return "bf16"
        return "fp32"
