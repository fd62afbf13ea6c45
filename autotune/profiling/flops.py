"""FLOPs of one training micro-step (forward + backward), counted by ``FlopCounterMode``.

Counting happens on the meta device by default: the model's parameters and buffers are swapped
for meta tensors of the same shape (``torch.func.functional_call``), so nothing is allocated or
computed and the cost does not depend on the model's size. It also matters for the number: on
CPU tensors ``F.scaled_dot_product_attention`` runs a fused kernel that the counter does not
see, while on meta it decomposes into the matmuls it is made of, which are counted.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from contextlib import AbstractContextManager
from typing import Any

import torch
from torch import nn
from torch.func import functional_call
from torch.utils.flop_counter import FlopCounterMode

from autotune.workloads import Workload

logger = logging.getLogger(__name__)


def _to_meta(value: Any) -> Any:
    return value.to("meta") if isinstance(value, torch.Tensor) else value


def run_train_step(
    model: nn.Module, inputs: Sequence[Any], mode: AbstractContextManager[Any], *, on_meta: bool
) -> list[torch.Tensor]:
    """One forward and backward of ``model(*inputs)`` under ``mode`` (a counter); returns the
    parameters' gradients.

    Gradients come from ``torch.autograd.grad``, so the model's ``.grad`` is left alone.
    ``on_meta`` runs on meta copies of the parameters, buffers and inputs: nothing is
    allocated or computed.
    """
    params: dict[str, torch.Tensor] = dict(model.named_parameters())
    buffers: dict[str, torch.Tensor] = dict(model.named_buffers())
    if on_meta:
        params = {
            name: torch.empty_like(p, device="meta").requires_grad_(p.requires_grad)
            for name, p in params.items()
        }
        buffers = {name: b.to("meta") for name, b in buffers.items()}
        inputs = [_to_meta(x) for x in inputs]
    step = _ForwardBackward(model, [p for p in params.values() if p.requires_grad])
    tensors = {f"model.{name}": t for name, t in {**params, **buffers}.items()}
    with mode:
        grads = functional_call(step, tensors, tuple(inputs))
    return [g for g in grads if g is not None]


class _ForwardBackward(nn.Module):
    """Forward and backward as one call, so that ``functional_call``'s tensors stay in place
    through backward too: activation checkpointing re-runs parts of the forward there."""

    def __init__(self, model: nn.Module, trainable: list[torch.Tensor]) -> None:
        super().__init__()
        self.model = model
        self.trainable = trainable  # a plain list: the tensors functional_call puts in place

    def forward(self, *inputs: Any) -> Sequence[torch.Tensor | None]:
        loss = self.model(*inputs)
        if not self.trainable:
            return ()
        return torch.autograd.grad(loss, self.trainable, allow_unused=True)


def _count(model: nn.Module, inputs: Sequence[Any], on_meta: bool) -> int:
    counter = FlopCounterMode(display=False)
    run_train_step(model, inputs, counter, on_meta=on_meta)
    return int(counter.get_total_flops())


def count_train_flops(model: nn.Module, inputs: Sequence[Any], *, on_meta: bool = True) -> int:
    """FLOPs of ``model(*inputs)`` and its backward, without the optimizer step.

    Args:
        model: A module whose forward returns a scalar loss.
        inputs: Its positional inputs for one micro-batch.
        on_meta: Count on meta copies of the parameters, buffers and inputs (nothing is
            computed, and attention is counted). ``False`` runs the real forward and backward
            where the tensors are; on CPU that misses scaled-dot-product attention.

    Returns:
        Total FLOPs (a multiply-add is 2).
    """
    return _count(model, inputs, on_meta)


def flops_per_micro_batch(
    workload: Workload,
    micro_batch_size: int,
    *,
    on_meta: bool = True,
    generator: torch.Generator | None = None,
) -> int:
    """FLOPs of one forward + backward of a workload's model on one micro-batch.

    One optimizer step costs this times ``gradient_accumulation_steps`` (per rank). If the
    model cannot run on meta, the count falls back to a real step on its own device.

    Args:
        workload: The workload.
        micro_batch_size: Samples in the micro-batch.
        on_meta: As for ``count_train_flops``.
        generator: For ``make_batch``; a CPU generator seeded with 0 if not given.

    Returns:
        Total FLOPs for the micro-batch.

    Example:
        >>> from autotune.workloads import build_gpt
        >>> flops_per_micro_batch(build_gpt("27m"), 4)  # 70.9e9 matmuls + 2.4e9 attention
        73282879488
    """
    if generator is None:
        generator = torch.Generator().manual_seed(0)
    inputs = workload.make_batch(micro_batch_size, generator)
    if on_meta:
        try:
            return _count(workload.model, inputs, on_meta=True)
        except Exception as exc:  # an op without a meta kernel, a tensor on a fixed device, ...
            logger.warning(
                "counting FLOPs on meta failed (%s); counting on the model's device", exc
            )
    return _count(workload.model, inputs, on_meta=False)
