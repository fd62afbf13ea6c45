"""ZeRO's model-state arithmetic: the bytes per rank of parameters, gradients, fp32 master and
optimizer state at each stage.

Torch-free on purpose: the tuner estimates memory with it before anything runs, and importing
the engine would pull in torch.distributed. The engine exposes the same formulas
(``autotune.engine.model_state_bytes``) and its tests hold its accounted bytes to them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from autotune.config import OptimizerConfig

Precision = Literal["fp32", "fp16", "bf16"]


@dataclass(frozen=True)
class ModelStateBytes:
    """Bytes per rank of each part of the model state, as the ZeRO paper counts them."""

    params: int
    grads: int
    master: int
    optimizer_state: int

    @property
    def total(self) -> int:
        return self.params + self.grads + self.master + self.optimizer_state


def model_state_bytes(
    num_params: int,
    stage: int,
    world_size: int,
    precision: Precision = "fp32",
    optimizer_state_floats: int = 2,
    offload_optimizer: bool = False,
) -> ModelStateBytes:
    """Device bytes per rank for parameters, gradients and optimizer state under ZeRO.

    With Ψ parameters and N ranks, fp32 and Adam (two fp32 states, no separate master copy):
    stage 0 16Ψ, stage 1 8Ψ + 8Ψ/N, stage 2 4Ψ + 12Ψ/N, stage 3 16Ψ/N. Mixed precision keeps
    2-byte parameters and gradients plus a 4-byte fp32 master, partitioned like the optimizer
    state (the paper's 2Ψ + 2Ψ + 12Ψ). Offloading the optimizer moves master and state to the
    host. Padding to a multiple of N is not included.

    Example:
        >>> model_state_bytes(1000, stage=2, world_size=4).total
        7000
    """
    weight = 4 if precision == "fp32" else 2
    master = 0 if precision == "fp32" and not offload_optimizer else 4
    state = 4 * optimizer_state_floats
    psi, n = num_params, world_size
    params = psi * weight // (n if stage >= 3 else 1)
    grads = psi * weight // (n if stage >= 2 else 1)
    sharded = n if stage >= 1 else 1
    if offload_optimizer:
        return ModelStateBytes(params, grads, 0, 0)
    return ModelStateBytes(params, grads, psi * master // sharded, psi * state // sharded)


def optimizer_state_floats(config: OptimizerConfig | None) -> int:
    """Floats of optimizer state per parameter (Adam and Lamb 2, SGD with momentum 1).

    Example:
        >>> optimizer_state_floats(OptimizerConfig(type="SGD", params={"momentum": 0.9}))
        1
    """
    if config is None:
        return 2
    name = config.type.lower()
    if name == "sgd":
        return 1 if config.params.get("momentum", 0) else 0
    if name in ("adagrad", "rmsprop"):
        return 1
    return 2
