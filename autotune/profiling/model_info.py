"""A cheap profile of a workload for the tuner's memory estimate: parameters, activations, FLOPs."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from autotune.experiment import Metrics
from autotune.profiling.flops import flops_per_micro_batch
from autotune.workloads import Workload


@dataclass(frozen=True)
class ModelInfo:
    """Sizes of a workload that do not depend on the ZeRO config."""

    num_params: int
    """Parameters, each shared parameter counted once."""
    param_bytes: int
    """Bytes of the parameters in their own dtypes."""
    activation_bytes_per_sample: int
    """Bytes that autograd saves for backward, per sample of the micro-batch (the slope between
    micro-batches of 1 and 2, so parts that do not grow with the batch are left out)."""
    flops_per_sample: float
    """FLOPs of forward + backward per sample (see ``flops_per_micro_batch``)."""

    @classmethod
    def from_metrics(cls, metrics: Metrics | None, world_size: int) -> ModelInfo | None:
        """The model's info as an experiment of a user's script measured it, or None if it
        did not (a workload experiment, or a failed one).

        A script's model is only seen once it trains, so the first experiment that finishes
        tells the tuner what a workload's tells it up front.
        """
        if metrics is None or metrics.num_params is None:
            return None
        samples_per_rank = metrics.train_batch_size / world_size
        return cls(
            num_params=metrics.num_params,
            param_bytes=metrics.param_bytes or 4 * metrics.num_params,
            activation_bytes_per_sample=metrics.activation_bytes_per_sample or 0,
            flops_per_sample=metrics.flops_per_step / samples_per_rank,
        )


def saved_activation_bytes(model: nn.Module, inputs: Sequence[Any]) -> int:
    """Bytes of the tensors autograd saves for backward during ``model(*inputs)``.

    Runs the forward for real (on the model's device), with ``saved_tensors_hooks`` recording
    every saved tensor. Tensors are counted by storage, once each, whole: a view keeps its whole
    storage alive. Parameters and buffers (and views of them) are not activations and are left
    out.

    Args:
        model: A module whose forward returns a loss.
        inputs: Its positional inputs.

    Returns:
        Bytes held for backward once the forward has returned.
    """
    own = {t.untyped_storage().data_ptr() for t in [*model.parameters(), *model.buffers()]}
    saved: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        ptr = storage.data_ptr()
        if ptr and ptr not in own:  # ptr 0: an empty storage, holds nothing
            saved[ptr] = storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = model(*inputs)
    del loss  # frees the graph and what it saved
    return sum(saved.values())


def saved_activation_bytes_on_meta(model: nn.Module, inputs: Sequence[Any]) -> int:
    """:func:`saved_activation_bytes` of a model whose parameters and inputs live on the meta
    device: nothing is allocated, so a model larger than this machine is measured too.
    Meta storages have no address; each is known by its identity instead."""
    own = {t.untyped_storage()._cdata for t in [*model.parameters(), *model.buffers()]}
    saved: dict[int, int] = {}
    keep: list[torch.Tensor] = []  # alive until counted, so no identity is reused meanwhile

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        if storage._cdata not in own:
            saved[storage._cdata] = storage.nbytes()
            keep.append(t)
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = model(*inputs)
    del loss
    keep.clear()
    return sum(saved.values())


_DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


def model_info_on_meta(workload: Workload, precision: str = "fp32") -> ModelInfo:
    """:func:`model_info` of a workload built on the meta device (``torch.device("meta")``),
    its floating-point parameters in ``precision`` (``fp16`` and ``bf16`` train in half
    precision, so their activations are half the size): what ``autotune plan`` knows of a
    model it will not run.

    Raises:
        RuntimeError: the model does not run on meta (an op without a meta kernel, a tensor
            made on a fixed device).
    """
    model = workload.model.to(_DTYPES[precision])
    params = list({id(p): p for p in model.parameters()}.values())
    generator = torch.Generator().manual_seed(0)

    def on_meta(size: int) -> list[Any]:
        return [
            x.to("meta") if isinstance(x, torch.Tensor) else x
            for x in workload.make_batch(size, generator)
        ]

    one = saved_activation_bytes_on_meta(model, on_meta(1))
    two = saved_activation_bytes_on_meta(model, on_meta(2))
    flops = flops_per_micro_batch(workload, 1, on_meta=True)
    return ModelInfo(
        num_params=sum(p.numel() for p in params),
        param_bytes=sum(p.numel() * p.element_size() for p in params),
        activation_bytes_per_sample=max(two - one, 0),
        flops_per_sample=float(flops),
    )


def model_info(workload: Workload, micro_batch_size: int = 1) -> ModelInfo:
    """Parameters, activation bytes and FLOPs of a workload, in about a second.

    Activations are measured with two real forwards, at micro-batches of 1 and 2, on the
    model's device; FLOPs are counted on meta at ``micro_batch_size``.

    Args:
        workload: The workload (its model on CPU, typically).
        micro_batch_size: The micro-batch at which FLOPs are counted.

    Returns:
        The model's info.
    """
    params = list({id(p): p for p in workload.model.parameters()}.values())
    generator = torch.Generator().manual_seed(0)
    one = saved_activation_bytes(workload.model, workload.make_batch(1, generator))
    two = saved_activation_bytes(workload.model, workload.make_batch(2, generator))
    flops = flops_per_micro_batch(workload, micro_batch_size)
    return ModelInfo(
        num_params=sum(p.numel() for p in params),
        param_bytes=sum(p.numel() * p.element_size() for p in params),
        activation_bytes_per_sample=max(two - one, 0),
        flops_per_sample=flops / micro_batch_size,
    )
