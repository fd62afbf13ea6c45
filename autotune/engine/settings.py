"""What the engine takes from a config: checked, with "auto" resolved, per component.

Every setting the built-in engine does not implement raises a ConfigError naming its key,
rather than being silently ignored.

Accepted but without effect in this engine (nothing for them to change here):
``round_robin_gradients`` and ``use_multi_rank_bucket_allreduce`` (bucket order is fixed and
identical on every rank), ``offload_optimizer.pin_memory`` on a machine without CUDA,
``stage3_module_granularity_threshold``, ``stage3_gather_16bit_weights_on_model_save`` (saving
always consolidates), ``elastic_checkpoint``, ``ignore_unused_parameters`` (unused parameters
always get zero gradients), ``load_from_fp32_weights``, ``memory_efficient_linear``, and the
top-level ``communication_data_type``, ``prescale_gradients``, ``gradient_predivide_factor``,
``fp32_allreduce`` and ``disable_allgather`` (gradients are reduced in the compute dtype,
averaged through the loss scale), and DeepSpeed's printouts ``wall_clock_breakdown``,
``memory_breakdown`` and ``dump_state`` (the profile window and the memory accounting
report). ``allgather_bucket_size`` and ``allgather_partitions`` act at stages 1-2; stage 3
gathers per module. On gloo every all-gather is a broadcast per rank (gloo's own all-gather is
the slow one, see collectives.py), so ``allgather_partitions`` changes nothing there.
``reduce_scatter: false`` all-reduces each bucket (DeepSpeed's fallback). In ``bf16``:
fp16's loss-scale keys (bf16 is never scaled), ``immediate_grad_update`` and
``check_grad_overflow``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from autotune.config import Config, ConfigError, OffloadDevice, ZeroConfig
from autotune.config.keys import get_field

# DeepSpeed's documented defaults, used for "auto" where the model size gives no better answer.
DEFAULT_BUCKET_NUMEL = 500_000_000
DEFAULT_PREFETCH_NUMEL = 50_000_000
DEFAULT_PERSISTENCE_THRESHOLD = 100_000
DEFAULT_MAX_LIVE_NUMEL = 1_000_000_000
DEFAULT_MAX_REUSE_DISTANCE = 1_000_000_000


@dataclass(frozen=True)
class ZeroSettings:
    """The ``zero_optimization`` knobs the engine acts on, as plain numbers (elements)."""

    stage: int
    reduce_bucket_numel: int
    allgather_bucket_numel: int
    overlap_comm: bool
    contiguous_gradients: bool
    reduce_scatter: bool
    allgather_partitions: bool
    prefetch_numel: int
    persistence_threshold: int
    max_live_numel: int
    max_reuse_distance: int
    sub_group_numel: int
    offload_optimizer: bool


def _unsupported(key: str, value: Any) -> ConfigError:
    return ConfigError(key, f"{value!r} is not supported by the built-in engine")


def check_supported(config: Config) -> None:
    """Raise for anything in ``config`` the engine would otherwise have to ignore."""
    if config.search_space:
        key = next(iter(config.search_space))
        raise ConfigError(key, "still holds several values to search; the engine needs one")
    for key in ("train_micro_batch_size_per_gpu", "gradient_accumulation_steps"):
        if not isinstance(getattr(config, key), int):
            raise ConfigError(key, "must be set (an integer) to train")
    if config.amp.enabled:
        raise _unsupported("amp.enabled", True)
    if config.sparse_gradients:
        raise _unsupported("sparse_gradients", True)
    for key, value in (
        ("fp16.fp16_master_weights_and_grads", config.fp16.fp16_master_weights_and_grads),
        ("bf16.bf16_master_weights_and_grads", config.bf16.bf16_master_weights_and_grads),
        ("bf16.bf16_optimizer_states", config.bf16.bf16_optimizer_states),
    ):
        if value:
            raise _unsupported(key, True)
    for key in ("fp16.enabled", "bf16.enabled", "gradient_clipping"):
        if get_field(config, key) == "auto":
            raise ConfigError(key, '"auto" must be resolved before training')
    zero = config.zero_optimization
    offload = zero.optimizer_offload_device
    if offload is OffloadDevice.nvme:
        raise _unsupported("zero_optimization.offload_optimizer.device", "nvme")
    if zero.param_offload_device is not OffloadDevice.none:
        raise _unsupported(
            "zero_optimization.offload_param.device", zero.param_offload_device.value
        )
    for flag in (
        "zero_quantized_weights",
        "zero_quantized_gradients",
        "zero_quantized_nontrainable_weights",
        "mics_hierarchical_params_gather",
    ):
        if getattr(zero, flag):
            raise _unsupported(f"zero_optimization.{flag}", True)
    if zero.zero_hpz_partition_size > 1:
        raise _unsupported(
            "zero_optimization.zero_hpz_partition_size", zero.zero_hpz_partition_size
        )
    if zero.mics_shard_size > 0:
        raise _unsupported("zero_optimization.mics_shard_size", zero.mics_shard_size)
    # AutoTP: Accelerate hands such a config straight to initialize() (the engine is data
    # parallel only; training it would silently replicate what the user asked to split).
    autotp_size = (config.tensor_parallel or {}).get("autotp_size", 0)
    if isinstance(autotp_size, int) and autotp_size > 1:
        raise _unsupported("tensor_parallel.autotp_size", autotp_size)


def resolve_zero(zero: ZeroConfig, num_params: int) -> ZeroSettings:
    """``zero`` as numbers; "auto" sizes follow the model (a quarter of it per bucket)."""
    auto_bucket = min(DEFAULT_BUCKET_NUMEL, max(1 << 20, num_params // 4))

    def size(value: int | str, auto: int) -> int:
        return auto if value == "auto" else int(value)

    return ZeroSettings(
        stage=zero.stage,
        reduce_bucket_numel=size(zero.reduce_bucket_size, auto_bucket),
        allgather_bucket_numel=size(zero.allgather_bucket_size, auto_bucket),
        overlap_comm=zero.overlap_comm is not False,  # "auto": overlap
        contiguous_gradients=zero.contiguous_gradients,
        reduce_scatter=zero.reduce_scatter,
        allgather_partitions=zero.allgather_partitions,
        prefetch_numel=size(
            zero.stage3_prefetch_bucket_size, min(DEFAULT_PREFETCH_NUMEL, auto_bucket)
        ),
        persistence_threshold=size(
            zero.stage3_param_persistence_threshold, DEFAULT_PERSISTENCE_THRESHOLD
        ),
        max_live_numel=size(zero.stage3_max_live_parameters, DEFAULT_MAX_LIVE_NUMEL),
        max_reuse_distance=size(zero.stage3_max_reuse_distance, DEFAULT_MAX_REUSE_DISTANCE),
        sub_group_numel=zero.sub_group_size,
        offload_optimizer=zero.optimizer_offload_device is OffloadDevice.cpu,
    )
