"""A cheap profile of a workload for the tuner's memory estimate: parameters, activations, FLOPs."""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Any

import torch
import torch.fx.experimental._config
import torch.nn.functional as F
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves
from torch.utils.flop_counter import flop_registry

from autotune.config import Config
from autotune.config.knobs import CHECKPOINTING_KEY
from autotune.experiment import Metrics
from autotune.profiling.flops import flops_per_micro_batch, run_train_step
from autotune.workloads import Workload, WorkloadError, check_workload, resolve_workload


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
    num_param_tensors: int = 0
    """Parameter tensors, each shared one once: ZeRO-2 and -3 hook each one's gradient every
    micro-step. 0 where unknown."""
    module_param_counts: tuple[int, ...] = ()
    """For every module that holds parameters itself, how many (its children's not counted):
    the units ZeRO-3 gathers one by one. Empty where unknown."""
    checkpointed_activation_bytes_per_sample: int | None = None
    """:attr:`activation_bytes_per_sample` with activation checkpointing on; None where the
    workload cannot switch it on."""
    checkpointed_backward_bytes_per_sample: int = 0
    """:attr:`backward_bytes_per_sample` with activation checkpointing on."""
    recompute_flops_per_sample: float = 0.0
    """FLOPs activation checkpointing adds per sample: the forward it runs again in backward."""

    @property
    def step_bytes_per_sample(self) -> int:
        """The most activation bytes a training step holds at once, per sample."""
        return self.activation_bytes_per_sample + self.backward_bytes_per_sample

    @property
    def can_checkpoint(self) -> bool:
        """Whether the workload can switch activation checkpointing on."""
        return self.checkpointed_activation_bytes_per_sample is not None

    def step_bytes(self, activation_checkpointing: bool = False) -> int:
        """:attr:`step_bytes_per_sample`, with activation checkpointing or without.

        Raises:
            ValueError: checkpointing asked of a workload that cannot switch it on.
        """
        if not activation_checkpointing:
            return self.step_bytes_per_sample
        if self.checkpointed_activation_bytes_per_sample is None:
            raise ValueError("this workload cannot switch activation checkpointing on")
        return (
            self.checkpointed_activation_bytes_per_sample
            + self.checkpointed_backward_bytes_per_sample
        )

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


class _SavedOnMeta:
    """A ``pack`` hook counting the bytes autograd saves for backward on meta, where
    storages have no address: each is known by its identity, and kept alive until counted so
    that no identity is reused meanwhile. Parameters and buffers are left out. Only the
    forward counts: what a checkpointed block saves again while backward recomputes it is
    freed as soon as that block's backward has run."""

    def __init__(self, model: nn.Module) -> None:
        self.own = {t.untyped_storage()._cdata for t in [*model.parameters(), *model.buffers()]}
        self.saved: dict[int, int] = {}
        self.keep: list[torch.Tensor] = []

    def pack(self, t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        in_backward = torch._C._current_graph_task_id() != -1
        if storage._cdata not in self.own and not in_backward:
            self.saved[storage._cdata] = storage.nbytes()
            self.keep.append(t)
        return t

    def hooks(self) -> Any:
        return torch.autograd.graph.saved_tensors_hooks(self.pack, lambda t: t)

    def total(self) -> int:
        self.keep.clear()
        return sum(self.saved.values())


def saved_activation_bytes_on_meta(model: nn.Module, inputs: Sequence[Any]) -> int:
    """:func:`saved_activation_bytes` of a model whose parameters and inputs live on the meta
    device: nothing is allocated, so a model larger than this machine is measured too."""
    counter = _SavedOnMeta(model)
    with counter.hooks():
        loss = model(*inputs)
    del loss
    return counter.total()


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


class _FusedAttention(torch.autograd.Function):
    """What a GPU's fused attention kernel (flash or memory-efficient) keeps for backward:
    queries, keys, values, the output and one fp32 log-sum-exp per query (and a mask, if
    given), never the sequence-by-sequence matrix of scores. On meta and on CPU,
    ``scaled_dot_product_attention`` takes the math path, which saves that matrix (in fp32
    even for bf16 inputs): counted as such, a GPT's activations came out 2.6 times what an
    H200 held (``results/landscapes/gpu-20261127``). Nothing is computed: this runs on meta."""

    @staticmethod
    def forward(
        ctx: Any, flops: list[int], q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *mask: Any
    ) -> Any:
        out = q.new_empty((*q.shape[:-1], v.shape[-1]))
        log_sum_exp = q.new_empty(q.shape[:-1], dtype=torch.float32)
        ctx.save_for_backward(q, k, v, out, log_sum_exp, *mask)
        ctx.num_masks, ctx.flops = len(mask), flops
        # The math path's two matmuls (scores, then the weighted values): what
        # FlopCounterMode counts where attention is not fused.
        ctx.forward_flops = 2 * q.shape[:-1].numel() * k.shape[-2] * (q.shape[-1] + v.shape[-1])
        flops[0] += ctx.forward_flops
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> Any:
        q, k, v = ctx.saved_tensors[:3]
        ctx.flops[0] += 2 * ctx.forward_flops  # each matmul's two input gradients
        return (None, torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)) + (
            None,
        ) * ctx.num_masks


@contextmanager
def _attention_as_on_gpu(flops: list[int]) -> Iterator[None]:
    """Runs ``scaled_dot_product_attention`` as :class:`_FusedAttention` while counting
    memory, adding the FLOPs of the math path to ``flops[0]`` (the model's own FLOPs, what
    :mod:`autotune.profiling.flops` counts).

    It replaces the function in ``torch.nn.functional`` for the while, where models look it
    up as they run: a ``TorchFunctionMode`` would not reach the forward that activation
    checkpointing runs again inside backward (a mode is off while it handles a call, and
    ``torch.autograd.grad`` is one). Planning counts on one thread, so nothing else sees it.
    """
    original = F.scaled_dot_product_attention

    def fused(
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        attn_mask: Any = None,
        *args: Any,
        **kwargs: Any,
    ) -> torch.Tensor:
        masks = (attn_mask,) if isinstance(attn_mask, torch.Tensor) else ()
        out: torch.Tensor = _FusedAttention.apply(flops, q, k, v, *masks)
        return out

    F.scaled_dot_product_attention = fused  # type: ignore[assignment]
    try:
        yield
    finally:
        F.scaled_dot_product_attention = original


class _FlopCount(TorchDispatchMode):
    """FLOPs of the ops run under it, by ``FlopCounterMode``'s formulas, without its module
    tracking: that hooks every module's inputs for backward, which fails under
    ``torch.autograd.grad`` where a module takes a parameter as an input (DeBERTa's relative
    position embeddings)."""

    def __init__(self) -> None:
        super().__init__()
        self.total = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        formula = flop_registry.get(func._overloadpacket)
        if formula is not None:
            self.total += int(formula(*args, **kwargs, out_val=out))
        return out


def parameter_counts(model: nn.Module) -> tuple[int, tuple[int, ...]]:
    """The model's parameter tensors (each shared one once), and for every module holding
    parameters itself how many it holds (a shared parameter with its first holder): the
    tensors ZeRO-2 and -3 hook, and the units ZeRO-3 gathers.

    Example:
        >>> parameter_counts(nn.Sequential(nn.Linear(4, 3), nn.ReLU(), nn.Linear(3, 2)))
        (4, (15, 8))
    """
    seen: set[int] = set()
    per_module = []
    for module in model.modules():
        own = [p for p in module.parameters(recurse=False) if id(p) not in seen]
        seen.update(id(p) for p in own)
        if own:
            per_module.append(sum(p.numel() for p in own))
    return len(seen), tuple(per_module)


def _profiled(
    model: nn.Module,
    measure: Callable[[], tuple[int, int, float]],
    checkpointing: Callable[[bool], None] | None,
) -> ModelInfo:
    """The info of ``model`` from ``measure()`` (per sample: bytes saved for backward, the
    step's peak beyond them, the FLOPs), measured again with ``checkpointing`` switched on
    where it is given: what checkpointing saves and the FLOPs it recomputes."""
    params = list({id(p): p for p in model.parameters()}.values())
    saved, backward, flops = measure()
    tensors, per_module = parameter_counts(model)
    info = ModelInfo(
        num_params=sum(p.numel() for p in params),
        param_bytes=sum(p.numel() * p.element_size() for p in params),
        activation_bytes_per_sample=saved,
        flops_per_sample=float(flops),
        backward_bytes_per_sample=backward,
        num_param_tensors=tensors,
        module_param_counts=per_module,
    )
    if checkpointing is None:
        return info
    checkpointing(True)
    try:
        saved, backward, checkpointed_flops = measure()
    finally:
        checkpointing(False)
    return replace(
        info,
        checkpointed_activation_bytes_per_sample=saved,
        checkpointed_backward_bytes_per_sample=backward,
        recompute_flops_per_sample=float(max(checkpointed_flops - flops, 0)),
    )


def model_info_on_meta(
    workload: Workload,
    precision: str = "fp32",
    checkpointing: Callable[[bool], None] | None = None,
) -> ModelInfo:
    """:func:`model_info` of a workload built on the meta device (``torch.device("meta")``),
    its floating-point parameters in ``precision`` (``fp16`` and ``bf16`` train in half
    precision, so their activations are half the size): what ``autotune plan`` knows of a
    model it will not run. Attention is counted as a GPU's fused kernel holds it
    (:class:`_FusedAttention`).

    ``checkpointing``, where the workload has it (:attr:`Workload.activation_checkpointing`),
    switches activation checkpointing on and off on the model: its activations and the
    FLOPs it adds are then measured too.

    Raises:
        RuntimeError: the model does not run on meta (an op without a meta kernel, a tensor
            made on a fixed device).
    """
    model = workload.model.to(_DTYPES[precision])
    generator = torch.Generator().manual_seed(0)

    def on_meta(size: int) -> list[Any]:
        return [
            x.to("meta") if isinstance(x, torch.Tensor) else x
            for x in workload.make_batch(size, generator)
        ]

    def step(size: int, count_flops: bool = False) -> tuple[int, int, int]:
        """Bytes saved for backward, the step's peak and (``count_flops``: else 0) the
        FLOPs, at micro-batch ``size``. Counting FLOPs keeps no tensor alive, so one pass
        counts all three."""
        saved, live, attention = _SavedOnMeta(model), _LiveBytes(), [0]
        flops = _FlopCount()

        @contextmanager
        def counting() -> Iterator[None]:
            with _attention_as_on_gpu(attention), live, saved.hooks():
                if count_flops:
                    with flops:
                        yield
                else:
                    yield

        grads = run_train_step(model, on_meta(size), counting(), on_meta=False)
        peak = live.peak(leaving_out={live.serial(g) for g in grads})
        return saved.total(), peak, flops.total + attention[0] if count_flops else 0

    def measure() -> tuple[int, int, int]:
        """Per sample: saved for backward, the step's peak beyond that, and the FLOPs.

        Two forward-backward passes, at micro-batches 1 and 2 (what does not grow with the
        batch drops out of the slope), each counting what is saved and the peak at once, the
        first the FLOPs too. On meta an op costs the same at any size, and these passes are
        most of a 70B model's plan."""
        saved_one, peak_one, flops = step(1, count_flops=True)
        saved_two, peak_two, _ = step(2)
        saved = max(saved_two - saved_one, 0)
        return saved, max(peak_two - peak_one - saved, 0), flops

    # A model that selects by value (DeBERTa's classifier keeps the labels >= 0 with
    # nonzero()) cannot ask meta tensors; its random inputs are all selected anyway.
    assume_selected = torch.fx.experimental._config.patch(  # type: ignore[attr-defined]
        meta_nonzero_assume_all_nonzero=True
    )

    def measure_selected() -> tuple[int, int, int]:
        with assume_selected:
            return measure()

    return _profiled(model, measure_selected, checkpointing)


def model_info(
    workload: Workload,
    micro_batch_size: int = 1,
    checkpointing: Callable[[bool], None] | None = None,
) -> ModelInfo:
    """Parameters, activation bytes and FLOPs of a workload, in about a second.

    Activations are measured with real steps at micro-batches of 1 and 2 on the model's device
    (forwards for what is saved, forwards and backwards for the step's peak); FLOPs are counted
    on meta at ``micro_batch_size``.

    Args:
        workload: The workload (its model on CPU, typically).
        micro_batch_size: The micro-batch at which FLOPs are counted.
        checkpointing: as for :func:`model_info_on_meta`: the checkpointed activations and
            the FLOPs recomputed are measured too.

    Returns:
        The model's info.
    """
    model = workload.model
    generator = torch.Generator().manual_seed(0)
    batch = lambda size: workload.make_batch(size, generator)  # noqa: E731

    def measure() -> tuple[int, int, float]:
        saved = _per_sample(lambda size: saved_activation_bytes(model, batch(size)))
        peak = _per_sample(lambda size: step_peak_bytes(model, batch(size)))
        flops = flops_per_micro_batch(workload, micro_batch_size) / micro_batch_size
        return saved, max(peak - saved, 0), flops

    return _profiled(model, measure, checkpointing)


def profile_workload(config: Config, workload: str, workload_args: Mapping[str, Any]) -> ModelInfo:
    """Profile a workload (sizes, activations, FLOPs) before any experiment of ``config``:
    checkpointed too where the config switches activation checkpointing on or searches it.

    Raises:
        WorkloadError: the workload spec is unusable, or its model fails a real step.
    """
    seed = config.autotuning.seed
    check_workload(workload, workload_args, seed=seed)
    checkpointed = config.activation_checkpointing.enabled or bool(
        config.search_space.get(CHECKPOINTING_KEY)
    )
    try:
        resolved = resolve_workload(workload, workload_args, seed=seed)
        if checkpointed and resolved.activation_checkpointing is None:
            raise WorkloadError(
                f"workload {workload!r}: cannot switch activation checkpointing on (the "
                f"config's {CHECKPOINTING_KEY}); a built-in gpt or an hf: workload can"
            )
        switch = resolved.activation_checkpointing if checkpointed else None
        info = model_info(resolved, 1, switch)
    except WorkloadError:
        raise
    except Exception as err:  # the user's model failed a real forward/backward on CPU
        raise WorkloadError(
            f"workload {workload!r}: profiling one micro-batch failed: {type(err).__name__}: {err}"
        ) from None
    if not _has_cuda():
        # The estimate predicts what an experiment will measure: on CPU the engine's
        # accounting (which the stand-in budget is held to) counts the tensors saved for
        # backward, not the gradients in flight that a CUDA allocator also sees.
        info = replace(info, backward_bytes_per_sample=0, checkpointed_backward_bytes_per_sample=0)
    return info


def _has_cuda() -> bool:
    return torch.cuda.is_available()
