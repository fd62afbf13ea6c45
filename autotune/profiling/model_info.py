"""A cheap profile of a workload for the tuner's memory estimate: parameters, activations, FLOPs."""

from __future__ import annotations

import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from autotune.experiment import Metrics
from autotune.profiling.flops import flops_per_micro_batch, run_train_step
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
    backward_bytes_per_sample: int = 0
    """What backward holds at its peak beyond the saved activations, per sample: the gradients
    flowing back (an op's output gradient and its input gradient are alive at once, the largest
    at the loss: a language model's logits). A GPU's allocator sees them; 0 where unknown."""

    @property
    def step_bytes_per_sample(self) -> int:
        """The most activation bytes a training step holds at once, per sample."""
        return self.activation_bytes_per_sample + self.backward_bytes_per_sample

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


class _LiveBytes(TorchDispatchMode):
    """When each storage made under it was made and freed, counted once per storage (views and
    in-place ops share one). Frees are seen by a finalizer: torch keeps a storage's Python
    object alive as long as the storage itself, wherever autograd holds it. A storage is known
    by its address while it lives and by a serial number in the log: addresses are reused."""

    def __init__(self) -> None:
        super().__init__()
        self.events: list[tuple[int, int]] = []  # (serial, +bytes made / -bytes freed)
        self._live: dict[int, tuple[int, int]] = {}  # address -> (serial, bytes)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for tensor in tree_leaves(out):
            if isinstance(tensor, torch.Tensor):
                self._track(tensor.untyped_storage())
        return out

    def _track(self, storage: torch.UntypedStorage) -> None:
        address = storage._cdata
        if address not in self._live:
            serial = len(self.events)
            self._live[address] = (serial, storage.nbytes())
            self.events.append((serial, storage.nbytes()))
            weakref.finalize(storage, self._free, address).atexit = False

    def _free(self, address: int) -> None:
        serial, nbytes = self._live.pop(address, (None, 0))
        if serial is not None:
            self.events.append((serial, -nbytes))

    def serial(self, tensor: torch.Tensor) -> int | None:
        """The serial number of a live tensor's storage (None: not made under this mode)."""
        made = self._live.get(tensor.untyped_storage()._cdata)
        return made[0] if made else None

    def peak(self, leaving_out: set[int | None]) -> int:
        """The most bytes alive at once, the storages of the serials in ``leaving_out`` not
        counted."""
        current = peak = 0
        for serial, nbytes in self.events:
            if serial not in leaving_out:
                current += nbytes
                peak = max(peak, current)
        return peak


def step_peak_bytes(model: nn.Module, inputs: Sequence[Any], *, on_meta: bool = False) -> int:
    """The most bytes a training step's activations and backward's gradients in flight hold at
    once. The parameters' own gradients are left out: they do not grow with the batch, and
    where they pile up (the end of backward) would hide where activations peak (its start).
    ``on_meta`` as for :func:`autotune.profiling.flops.run_train_step`."""
    live = _LiveBytes()
    grads = run_train_step(model, inputs, live, on_meta=on_meta)
    return live.peak(leaving_out={live.serial(g) for g in grads})


def _per_sample(measure: Callable[[int], int]) -> int:
    """The slope of ``measure(micro_batch)`` between micro-batches of 1 and 2: what does not
    grow with the batch (parameters, their gradients) drops out."""
    return max(measure(2) - measure(1), 0)


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

    saved = _per_sample(lambda size: saved_activation_bytes_on_meta(model, on_meta(size)))
    peak = _per_sample(lambda size: step_peak_bytes(model, on_meta(size), on_meta=True))
    flops = flops_per_micro_batch(workload, 1, on_meta=True)
    return ModelInfo(
        num_params=sum(p.numel() for p in params),
        param_bytes=sum(p.numel() * p.element_size() for p in params),
        activation_bytes_per_sample=saved,
        flops_per_sample=float(flops),
        backward_bytes_per_sample=max(peak - saved, 0),
    )


def model_info(workload: Workload, micro_batch_size: int = 1) -> ModelInfo:
    """Parameters, activation bytes and FLOPs of a workload, in about a second.

    Activations are measured with real steps at micro-batches of 1 and 2 on the model's device
    (forwards for what is saved, forwards and backwards for the step's peak); FLOPs are counted
    on meta at ``micro_batch_size``.

    Args:
        workload: The workload (its model on CPU, typically).
        micro_batch_size: The micro-batch at which FLOPs are counted.

    Returns:
        The model's info.
    """
    model = workload.model
    params = list({id(p): p for p in model.parameters()}.values())
    generator = torch.Generator().manual_seed(0)
    batch = lambda size: workload.make_batch(size, generator)  # noqa: E731
    saved = _per_sample(lambda size: saved_activation_bytes(model, batch(size)))
    peak = _per_sample(lambda size: step_peak_bytes(model, batch(size)))
    flops = flops_per_micro_batch(workload, micro_batch_size)
    return ModelInfo(
        num_params=sum(p.numel() for p in params),
        param_bytes=sum(p.numel() * p.element_size() for p in params),
        activation_bytes_per_sample=saved,
        flops_per_sample=flops / micro_batch_size,
        backward_bytes_per_sample=max(peak - saved, 0),
    )
