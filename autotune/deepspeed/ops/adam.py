"""``deepspeed.ops.adam``: DeepSpeed's Adam optimizers, built as torch's.

DeepSpeed's CPU Adam is a vectorised kernel that steps the optimizer in host memory when
``offload_optimizer`` puts it there; ``FusedAdam`` its GPU kernel. On the built-in engine where
the step runs is the config's choice alone (``zero_optimization.offload_optimizer``: the fp32
master and the optimizer state live in host memory and step there), and the step is torch's:
these return ``torch.optim.AdamW`` (``adamw_mode``, decoupled weight decay) or
``torch.optim.Adam`` (L2 weight decay) with the same hyperparameters.

Example:
    >>> import torch
    >>> weights = [torch.nn.Parameter(torch.ones(2))]
    >>> type(DeepSpeedCPUAdam(weights, lr=1e-3, weight_decay=0.01)).__name__
    'AdamW'
    >>> type(FusedAdam(weights, adam_w_mode=False)).__name__
    'Adam'
"""

from collections.abc import Iterable
from typing import Any

import torch

from autotune.lazy import lazy_getattr


def _adam(
    params: Iterable[Any],
    decoupled: bool,
    lr: float,
    bias_correction: bool,
    betas: tuple[float, float],
    eps: float,
    weight_decay: float,
    amsgrad: bool,
) -> torch.optim.Optimizer:
    if not bias_correction:
        raise ValueError(
            "DeepSpeed's Adam with bias_correction=False is not served by autotune's built-in "
            "engine (torch's Adam always corrects the bias)"
        )
    cls = torch.optim.AdamW if decoupled else torch.optim.Adam
    return cls(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, amsgrad=amsgrad)


def DeepSpeedCPUAdam(
    model_params: Iterable[Any],
    lr: float = 1e-3,
    bias_correction: bool = True,
    betas: tuple[float, float] = (0.9, 0.999),
    eps: float = 1e-8,
    weight_decay: float = 0.0,
    amsgrad: bool = False,
    adamw_mode: bool = True,
    fp32_optimizer_states: bool = True,
) -> torch.optim.Optimizer:
    """DeepSpeed's ``DeepSpeedCPUAdam(...)``: torch's AdamW (``adamw_mode``) or Adam."""
    del fp32_optimizer_states  # the engine's optimizer state is fp32 always
    return _adam(model_params, adamw_mode, lr, bias_correction, betas, eps, weight_decay, amsgrad)


def FusedAdam(
    params: Iterable[Any],
    lr: float = 1e-3,
    bias_correction: bool = True,
    betas: tuple[float, float] = (0.9, 0.999),
    eps: float = 1e-8,
    adam_w_mode: bool = True,
    weight_decay: float = 0.0,
    amsgrad: bool = False,
    set_grad_none: bool = True,
) -> torch.optim.Optimizer:
    """DeepSpeed's ``FusedAdam(...)``: torch's AdamW (``adam_w_mode``) or Adam."""
    del set_grad_none
    return _adam(params, adam_w_mode, lr, bias_correction, betas, eps, weight_decay, amsgrad)


__getattr__ = lazy_getattr(__name__, {}, not_served="DeepSpeed")

__all__ = ["DeepSpeedCPUAdam", "FusedAdam"]
