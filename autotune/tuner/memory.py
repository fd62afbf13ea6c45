"""How much device memory a candidate needs per rank, estimated before running anything.

The estimate decides which ZeRO stages are worth trying and where the micro-batch search
starts. It is deliberately simple — model states (the engine's ZeRO formulas) plus activations
growing linearly with the micro-batch — and keeps a margin for what it leaves out (flat
buffers, communication buckets, fragmentation). Running the experiment confirms it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from autotune.engine.memory import model_state_bytes
from autotune.engine.optimizers import optimizer_state_floats

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

    @property
    def usable_bytes(self) -> int:
        return int(self.budget_bytes * (1.0 - self.margin_fraction))

    def bytes_at(self, micro_batch_size: int) -> int:
        return self.model_states_bytes + self.activation_bytes_per_sample * micro_batch_size

    def fits(self, micro_batch_size: int) -> bool:
        return self.bytes_at(micro_batch_size) <= self.usable_bytes

    def max_micro_batch_size(self, cap: int = 1 << 20) -> int:
        """The largest micro-batch that fits (at most ``cap``); 0 when not even the states fit."""
        room = self.usable_bytes - self.model_states_bytes
        if room < 0:
            return 0
        if self.activation_bytes_per_sample <= 0:
            return cap
        return min(cap, room // self.activation_bytes_per_sample)

    def explain(self, micro_batch_size: int) -> str:
        """Why a micro-batch does or does not fit, with the numbers."""
        verdict = "fits in" if self.fits(micro_batch_size) else "exceeds"
        return (
            f"estimated {_gib(self.bytes_at(micro_batch_size))} per rank at micro-batch "
            f"{micro_batch_size} (model states {_gib(self.model_states_bytes)} + activations "
            f"{_gib(self.activation_bytes_per_sample)}/sample) {verdict} "
            f"{_gib(self.usable_bytes)} usable of {_gib(self.budget_bytes)}"
        )


def estimate_memory(
    model_info: ModelInfo,
    config: Config,
    stage: int,
    offload_optimizer: bool,
    budget_bytes: int,
    margin_fraction: float = DEFAULT_MARGIN_FRACTION,
) -> MemoryEstimate:
    """The per-rank memory estimate of ``config`` run at ``stage``.

    Reads precision, optimizer, world size and ``autotuning.mp_size`` from the config.
    Parameters are split over ``mp_size`` model-parallel ranks; activations are taken as
    measured (in the model's own dtype), which overestimates them under fp16/bf16.

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
        activation_bytes_per_sample=model_info.activation_bytes_per_sample,
        budget_bytes=budget_bytes,
        margin_fraction=margin_fraction,
    )


def _gib(num_bytes: int) -> str:
    return f"{num_bytes / 2**30:.2f} GiB"
