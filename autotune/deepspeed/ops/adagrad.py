"""``deepspeed.ops.adagrad``: DeepSpeed's CPU Adagrad, built as torch's.

Accelerate swaps a torch ``Adagrad`` for it when the config offloads the optimizer. As with
:mod:`autotune.deepspeed.ops.adam`, where the step runs is the config's choice alone on the
built-in engine, and the step is torch's.

Example:
    >>> import torch
    >>> weights = [torch.nn.Parameter(torch.ones(2))]
    >>> type(DeepSpeedCPUAdagrad(weights, lr=1e-2)).__name__
    'Adagrad'
"""

from collections.abc import Iterable
from typing import Any

import torch

from autotune.lazy import lazy_getattr


def DeepSpeedCPUAdagrad(
    model_params: Iterable[Any],
    lr: float = 1e-2,
    eps: float = 1e-10,
    weight_decay: float = 0.0,
    amsgrad: bool = False,
    fp32_optimizer_states: bool = True,
) -> torch.optim.Optimizer:
    """DeepSpeed's ``DeepSpeedCPUAdagrad(...)``: torch's Adagrad."""
    del fp32_optimizer_states  # the engine's optimizer state is fp32 always
    if amsgrad:
        raise ValueError(
            "DeepSpeed's Adagrad with amsgrad=True is not served by autotune's built-in engine "
            "(torch's Adagrad has none)"
        )
    return torch.optim.Adagrad(model_params, lr=lr, eps=eps, weight_decay=weight_decay)


__getattr__ = lazy_getattr(__name__, {}, not_served="DeepSpeed")

__all__ = ["DeepSpeedCPUAdagrad"]
