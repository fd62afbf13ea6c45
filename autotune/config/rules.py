"""The rules a config must follow across fields (precision, offload and ZeRO stage, the
profiling window) and the batch triad ``train_batch_size = micro * accumulation * world_size``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from autotune.config.errors import ConfigError
from autotune.config.schema import DeepSpeedConfig, OffloadDevice
from autotune.config.validation import validate_section


def check_cross_field_rules(
    config: DeepSpeedConfig, search_space: Mapping[str, tuple[Any, ...]]
) -> None:
    """Rules that involve more than one key. A searched stage is checked per candidate."""
    if config.optimizer is not None:
        params_model = config.optimizer.params_model()
        if params_model is not None:
            validate_section(params_model, config.optimizer.params, "optimizer.params")
    if config.scheduler is not None:
        scheduler = config.scheduler
        validate_section(scheduler.params_model(), scheduler.params, "scheduler.params")

    fp16, bf16, amp = config.fp16.enabled is True, config.bf16.enabled is True, config.amp.enabled
    if fp16 and bf16:
        raise ConfigError("bf16.enabled", "fp16 and bf16 cannot both be enabled")
    if amp and (fp16 or bf16):
        raise ConfigError("amp.enabled", "amp cannot be combined with fp16 or bf16")

    zero = config.zero_optimization
    offload = zero.offload_optimizer
    for section, path in ((offload, "offload_optimizer"), (zero.offload_param, "offload_param")):
        if section is not None and section.device is OffloadDevice.nvme and not section.nvme_path:
            raise ConfigError(f"zero_optimization.{path}.nvme_path", "required for NVMe offload")

    if "zero_optimization.stage" not in search_space:
        stage = zero.stage
        if amp and stage > 0:
            raise ConfigError(
                "amp.enabled", f"amp is not compatible with ZeRO (zero_optimization.stage={stage})"
            )
        if zero.param_offload_device is not OffloadDevice.none and stage < 3:
            raise ConfigError(
                "zero_optimization.offload_param",
                f"parameter offload needs ZeRO stage 3, got stage {stage}",
            )
        if zero.optimizer_offload_device is OffloadDevice.nvme and stage < 3:
            raise ConfigError(
                "zero_optimization.offload_optimizer.device",
                f"NVMe optimizer offload needs ZeRO stage 3, got stage {stage}",
            )
        if zero.optimizer_offload_device is OffloadDevice.cpu and stage == 0:
            raise ConfigError(
                "zero_optimization.offload_optimizer.device",
                "CPU optimizer offload needs ZeRO stage 1, 2 or 3, got stage 0",
            )

    tuning = config.autotuning
    if tuning.end_profile_step < tuning.start_profile_step:
        raise ConfigError(
            "autotuning.end_profile_step",
            f"must not be less than start_profile_step ({tuning.end_profile_step} < "
            f"{tuning.start_profile_step})",
        )


# --- the batch triad ---------------------------------------------------------------------------


def resolve_batch_triad(
    train_batch_size: int | None,
    micro_batch_size: int | None,
    gradient_accumulation_steps: int | None,
    world_size: int,
) -> tuple[int | None, int | None, int | None]:
    """Fill in the triad ``train_batch_size = micro * accumulation * world_size``.

    Any two given infer the third; all three must agree. With only ``train_batch_size`` or
    only the micro-batch, accumulation is 1 (as in DeepSpeed). With neither, the triad stays
    open: the tuner chooses the micro-batch.

    Raises:
        ConfigError: if the given values cannot agree.
    """
    tbs, mbs, gas, n = train_batch_size, micro_batch_size, gradient_accumulation_steps, world_size
    if tbs is not None and mbs is not None and gas is not None:
        if tbs != mbs * gas * n:
            raise ConfigError(
                "train_batch_size",
                f"{tbs} != train_micro_batch_size_per_gpu {mbs} * gradient_accumulation_steps "
                f"{gas} * world_size {n} = {mbs * gas * n}",
            )
        return tbs, mbs, gas
    if tbs is not None and mbs is not None:
        return tbs, mbs, _divide(tbs, mbs * n, "gradient_accumulation_steps", f"{mbs} * {n}")
    if tbs is not None and gas is not None:
        return tbs, _divide(tbs, gas * n, "train_micro_batch_size_per_gpu", f"{gas} * {n}"), gas
    if mbs is not None:
        gas = gas or 1
        return mbs * gas * n, mbs, gas
    if tbs is not None:
        return tbs, _divide(tbs, n, "train_micro_batch_size_per_gpu", str(n)), 1
    return None, None, gas


def _divide(total: int, divisor: int, inferred_key: str, divisor_text: str) -> int:
    if total % divisor:
        raise ConfigError(
            "train_batch_size",
            f"{total} is not divisible by {divisor_text} (= {divisor}), so {inferred_key} "
            "cannot be a whole number",
        )
    return total // divisor
