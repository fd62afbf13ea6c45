"""How much device memory a candidate needs per rank, estimated before running anything.

The estimate decides which ZeRO stages are worth trying, where the micro-batch search starts
and which variant the model-based tuner searches first. It is deliberately simple — model
states (ZeRO's formulas in :mod:`autotune.model_states`, which the engine is held to), the
engine's communication buffers, and activations growing linearly with the micro-batch — and
keeps a margin for what it leaves out (fragmentation, temporaries). Running the experiment
confirms it.

The buffers were calibrated on the engine's own peak-memory accounting (the landscape
``results/landscapes/gpt_vocab_80mib.json``: 4.4M parameters, fp32, AdamW, two gloo ranks):
with the default buckets (larger than the model, so one bucket holds it all) stage 0 matched
the ZeRO formula exactly, stage 1 held one bucket more (gloo's receive buffer, absent with one
rank), stage 2 two (plus the gradients' staging bucket), and stage 3 did not fit where the
formula alone said 33 samples would: it also gathers parameters, up to
``stage3_max_live_parameters``.

DeepSpeed allocates its buckets whole, whatever the model's size: stage 2's gradients are
copied into a buffer of ``reduce_bucket_size`` elements (two with ``overlap_comm``), stage 3
reduces through one too. With its default 5e8 elements that is 1 GB in fp16, which is why
DeepSpeed's GPT2 run fit 15 samples a GPU at stage 1 and failed at 15 at stage 2.

Activations are what backward holds at its peak, per sample: the tensors saved for it plus
the gradients in flight (:class:`~autotune.profiling.model_info.ModelInfo`), in the
training precision, with or without activation checkpointing. On an H100 (one rank, NCCL, a
17M-parameter GPT with an 8192-token vocabulary) the saved tensors alone were 28% short of
the allocator's slope; with the gradients in flight the estimate came within a few percent
at every stage (``results/gpu/``). On an H200, a 406M GPT in bf16: 1.17 GB a sample counted
(attention as a fused kernel keeps it) against 1.12 GB measured, 0.36 against 0.36 with
checkpointing (``results/landscapes/gpu-20261127``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from autotune.config import EngineName
from autotune.config.sizes import format_size, format_sizes_apart
from autotune.model_states import model_state_bytes, optimizer_state_floats

if TYPE_CHECKING:
    from autotune.config import Config
    from autotune.profiling.model_info import ModelInfo

# Share of the device budget kept free for what the estimate does not count.
DEFAULT_MARGIN_FRACTION = 0.1


@dataclass(frozen=True)
class MemoryEstimate:
    """Estimated bytes per rank for one stage (and offload choice), as a line in the micro-batch.

    Example:
        >>> est = MemoryEstimate(model_states_bytes=6_000, activation_bytes_per_sample=1_000,
        ...                      budget_bytes=10_000, margin_fraction=0.1)
        >>> est.bytes_at(2), est.fits(3), est.max_micro_batch_size()
        (8000, True, 3)
    """

    model_states_bytes: int
    activation_bytes_per_sample: int
    budget_bytes: int
    margin_fraction: float = DEFAULT_MARGIN_FRACTION
    buffer_bytes: int = 0  # communication buckets and gathered parameters

    @property
    def usable_bytes(self) -> int:
        return int(self.budget_bytes * (1.0 - self.margin_fraction))

    def bytes_at(self, micro_batch_size: int) -> int:
        fixed = self.model_states_bytes + self.buffer_bytes
        return fixed + self.activation_bytes_per_sample * micro_batch_size

    def fits(self, micro_batch_size: int) -> bool:
        return self.bytes_at(micro_batch_size) <= self.usable_bytes

    def max_micro_batch_size(self, cap: int = 1 << 20) -> int:
        """The largest micro-batch that fits (at most ``cap``); 0 when not even the states fit."""
        room = self.usable_bytes - self.model_states_bytes - self.buffer_bytes
        if room < 0:
            return 0
        if self.activation_bytes_per_sample <= 0:
            return cap
        return min(cap, room // self.activation_bytes_per_sample)

    def explain(self, micro_batch_size: int) -> str:
        """Why a micro-batch does or does not fit, with the numbers."""
        verdict = "fits in" if self.fits(micro_batch_size) else "exceeds"
        estimated, usable = format_sizes_apart(self.bytes_at(micro_batch_size), self.usable_bytes)
        return (
            f"estimated {estimated} per rank at micro-batch {micro_batch_size} (model states "
            f"{format_size(self.model_states_bytes)} + buffers {format_size(self.buffer_bytes)}"
            f" + activations {format_size(self.activation_bytes_per_sample)}/sample) {verdict} "
            f"{usable} usable of {format_size(self.budget_bytes)}"
        )


def estimate_memory(
    model_info: ModelInfo,
    config: Config,
    stage: int,
    offload_optimizer: bool,
    budget_bytes: int,
    margin_fraction: float = DEFAULT_MARGIN_FRACTION,
    activation_checkpointing: bool = False,
) -> MemoryEstimate:
    """The per-rank memory estimate of ``config`` run at ``stage``.

    Reads precision, optimizer, world size, ``autotuning.mp_size`` and the engine from the
    config. Parameters are split over ``mp_size`` model-parallel ranks; activations are
    taken as measured (``model_info`` counts them in the training precision), with
    activation checkpointing where asked.

    Example:
        >>> from autotune.config import load_config
        >>> from autotune.profiling.model_info import ModelInfo
        >>> info = ModelInfo(num_params=10**6, param_bytes=4 * 10**6,
        ...                  activation_bytes_per_sample=10**6, flops_per_sample=1e9)
        >>> est = estimate_memory(info, load_config({}, 2), stage=3, offload_optimizer=False,
        ...                       budget_bytes=10**8)
        >>> est.model_states_bytes
        8000000
    """
    states = model_state_bytes(
        num_params=model_info.num_params // config.autotuning.mp_size,
        stage=stage,
        world_size=config.world_size,
        precision=config.precision,
        optimizer_state_floats=optimizer_state_floats(config.optimizer),
        offload_optimizer=offload_optimizer,
    )
    return MemoryEstimate(
        model_states_bytes=states.total,
        # Checkpointed activations not measured (a script's model): the plain ones bound them.
        activation_bytes_per_sample=model_info.step_bytes(
            activation_checkpointing and model_info.can_checkpoint
        ),
        budget_bytes=budget_bytes,
        margin_fraction=margin_fraction,
        buffer_bytes=buffer_bytes(model_info, config, stage),
    )


def buffer_bytes(model_info: ModelInfo, config: Config, stage: int) -> int:
    """The engine's communication buffers at ``stage`` (see the module docstring).

    Example:
        >>> from autotune.config import load_config
        >>> from autotune.profiling.model_info import ModelInfo
        >>> info = ModelInfo(num_params=10**6, param_bytes=4 * 10**6,
        ...                  activation_bytes_per_sample=0, flops_per_sample=1e9)
        >>> [buffer_bytes(info, load_config({}, 2), s) for s in range(4)]
        [0, 4000000, 8000000, 12000000]
        >>> [buffer_bytes(info, load_config({}, 1), s) for s in range(4)]  # nothing to exchange
        [0, 0, 4000000, 8000000]
    """
    zero = config.zero_optimization
    weight = model_info.param_bytes / max(1, model_info.num_params)
    num_params = model_info.num_params // config.autotuning.mp_size
    gathered = min(_elements(zero.stage3_max_live_parameters), num_params) if stage == 3 else 0
    if config.autotuning.engine is EngineName.deepspeed:
        # Whole buckets, as DeepSpeed allocates them (see the module docstring).
        size = zero.reduce_bucket_size
        # "auto" (the HF Trainer's fill-in) is unknown here: at most the model's size.
        bucket = _elements(size) if isinstance(size, int | float) else num_params
        copies = 2 if zero.overlap_comm is True else 1
        buckets = {0: 0, 1: 0, 2: copies, 3: 1}[stage]
        return int(weight * (buckets * bucket + gathered))
    bucket = min(_elements(zero.reduce_bucket_size), num_params)
    staging = 1 if stage >= 2 else 0  # gradients gathered into a bucket before they reduce
    exchange = 1 if stage >= 1 and config.world_size > 1 else 0  # gloo's receive buffer
    buckets = staging + exchange
    return int(weight * (buckets * bucket + gathered))


def _elements(value: object) -> int:
    """A bucket-like size in elements; ``"auto"`` (or anything not a number) is unbounded."""
    return int(value) if isinstance(value, int | float) else 1 << 62
