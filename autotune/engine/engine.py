"""The training engine: a DeepSpeed-shaped wrapper that runs ZeRO stages 0-3.

``engine(*inputs)`` runs the model, ``engine.backward(loss)`` computes and reduces gradients,
``engine.step()`` updates parameters at each gradient-accumulation boundary. How parameters,
gradients and optimizer state are laid out and communicated depends on the stage:

=====  ============================  ==========================  ==========================
stage  parameters                    gradients                   optimizer (fp32 master)
=====  ============================  ==========================  ==========================
0      full, one flat buffer         full, all-reduced           full
1      full, all-gathered after step full, reduced at boundary   this rank's shard
2      full, all-gathered after step this rank's shard           this rank's shard
3      this rank's shard, gathered   this rank's shard           this rank's shard
       per module (stage3.py)
=====  ============================  ==========================  ==========================
"""

from __future__ import annotations

import math
import warnings
import weakref
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager, nullcontext
from functools import partial
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from autotune.config import Config
from autotune.engine import checkpoint, hooks
from autotune.engine.accessors import DeepSpeedAccessors
from autotune.engine.backward_span import engine_backward
from autotune.engine.collectives import Communicator, local_cuda_device
from autotune.engine.loss_scaler import build_loss_scaler
from autotune.engine.master import MasterParams, OptimizerFactory, ParamGroups
from autotune.engine.memory_tracker import ActivationTracker, MemoryTracker
from autotune.engine.partition import segment_rows
from autotune.engine.schedulers import build_scheduler
from autotune.engine.settings import ZeroSettings, check_supported, resolve_zero
from autotune.engine.stage3 import _UnitRef
from autotune.engine.stages import Placement, account_untrained, build_stage, param_groups

_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
_SCHEDULER_ORDER_WARNINGS = r"(Detected call of .lr_scheduler\.step|Seems like .optimizer\.step)"
# Live engines, so that zero.GatheredParameters can find the one that holds a parameter.
_ENGINES: weakref.WeakSet[ZeroEngine] = weakref.WeakSet()


class ZeroEngine(DeepSpeedAccessors, nn.Module):
    """A model being trained with ZeRO over a process group. Build it with :func:`initialize`."""

    def __init__(
        self,
        module: nn.Module,
        config: Config,
        group: dist.ProcessGroup | None,
        model_parameters: Iterable[Any] | None = None,
        device_memory_bytes: int | None = None,
        optimizer_factory: OptimizerFactory | None = None,
    ) -> None:
        super().__init__()
        check_supported(config)
        self.config = config
        self.communicator = Communicator(group)
        backend = dist.get_backend(group) if group is not None else None
        if backend == dist.Backend.NCCL:
            self.device = local_cuda_device()
        else:
            self.device = next(module.parameters()).device
        self.dtype = _DTYPES[config.precision]
        module.to(device=self.device)
        if self.dtype != torch.float32:
            module.to(dtype=self.dtype)
        self.module = module
        self._broadcast_module()

        trainable, group_options, group_of = param_groups(module, model_parameters)
        self.zero: ZeroSettings = resolve_zero(
            config.zero_optimization, sum(p.numel() for p in trainable)
        )
        budget = (
            device_memory_bytes if device_memory_bytes is not None else (config.device_memory_bytes)
        )
        self.memory_tracker = MemoryTracker(self.device, budget)
        self.communicator.tracker = self.memory_tracker  # its receive buffers count too
        self._activations = (
            ActivationTracker(self.memory_tracker) if self.device.type == "cpu" else None
        )
        account_untrained(module, trainable, self.memory_tracker)

        placement = Placement(
            self.zero, self.communicator, self.memory_tracker, self.dtype, self.device
        )
        built = build_stage(module, trainable, placement)
        self.params, self.layout, self.grads = built.params, built.layout, built.grads
        self.stage3, self._flat_params = built.stage3, built.flat_params
        if self._flat_params is not None and self._activations is not None:
            # The flat buffer holds the weights: backward saving a view of it is no activation.
            self._activations.excluded.add(self._flat_params.untyped_storage().data_ptr())
        self.master = MasterParams(
            built.owned,
            self.grads.owned_grads,
            built.params_in_owned,
            ParamGroups(group_options, tuple(group_of[id(p)] for p in self.params)),
            config.optimizer,
            self.memory_tracker,
            offload=self.zero.offload_optimizer,
            sub_group_numel=self.zero.sub_group_numel,
            # From stage 1 on a parameter may be split across ranks (a world of one sums nothing).
            sum_over_ranks=self.communicator.sum_small if self.zero.stage > 0 else None,
            optimizer_factory=optimizer_factory,
        )
        self.optimizer = self.master.optimizer
        self.lr_scheduler: Any = build_scheduler(config.scheduler, self.optimizer)
        self.loss_scaler = build_loss_scaler(config.fp16)
        self._hooks = [
            p.register_post_accumulate_grad_hook(self._grad_hook(i))
            for i, p in enumerate(self.params)
        ]
        self.micro_steps = 0
        self.global_steps = 0
        self.skipped_steps = 0
        self._step_skipped = False
        # The boundary a client set (set_gradient_accumulation_boundary), else None: counted.
        self._boundary: bool | None = None
        # DeepSpeed's flag that the last step was skipped (Accelerate reads it).
        self.optimizer.overflow = False  # type: ignore[attr-defined]
        self._grad_norm: torch.Tensor | None = None  # 0-d, unscaled; read on demand
        self._param_ids = frozenset(id(p) for p in self.params)
        _ENGINES.add(self)

    # --- building -------------------------------------------------------------------------

    def _broadcast_module(self) -> None:
        """Every rank starts from rank 0's weights and buffers, as DeepSpeed does."""
        self.communicator.broadcast_from_first([*self.module.parameters(), *self.module.buffers()])

    def _grad_hook(self, index: int) -> Callable[[nn.Parameter], None]:
        # Weak: the hook is held by the parameter on the C++ side, where the garbage collector
        # cannot see a cycle back to the engine; a strong reference would keep every engine,
        # model and process group of a long-lived (warm) process alive.
        engine_ref = weakref.ref(self)

        def hook(param: nn.Parameter) -> None:
            engine = engine_ref()
            if engine is None:
                return
            engine.grads.on_grad(index, param)
            if engine.stage3 is not None:
                engine.stage3.grad_done(param)

        return hook

    # --- the training loop ----------------------------------------------------------------

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        observer = hooks.current()
        if observer is not None:
            observer.on_forward(self, args, kwargs)
        if self.stage3 is not None:
            self.stage3.begin_micro_step()
        saved = (
            torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack)
            if self.stage3 is not None or self._activations is not None
            else nullcontext()
        )
        early = partial(self._check_memory, "in forward") if self.stage3 is None else None
        deciding = self._activations.deciding_early(early) if self._activations else nullcontext()
        with saved, deciding:  # over the budget: see ActivationTracker.deciding_early
            output = self.module(*args, **kwargs)
        self._check_memory("in forward")
        return output

    def _pack(self, tensor: torch.Tensor) -> object:
        if self.stage3 is not None:
            ref = self.stage3.pack(tensor)
            if ref is not None:
                return ref
            if self.stage3.is_gathered_storage(tensor):
                return tensor  # a persistent parameter, already accounted
        if self._activations is not None:
            return self._activations.pack(tensor)
        return tensor

    def _unpack(self, saved: object) -> torch.Tensor:
        if isinstance(saved, _UnitRef):
            assert self.stage3 is not None
            return self.stage3.unpack(saved)
        return ActivationTracker.unpack(saved)

    def backward(
        self, loss: torch.Tensor, retain_graph: bool = False, scale_wrt_gas: bool = True
    ) -> torch.Tensor:
        """Gradients of ``loss``, averaged over ranks and (with ``scale_wrt_gas``, as
        DeepSpeed's default) over accumulation steps, then reduced at the boundary.

        ``scale_wrt_gas=False`` is for a client that divides the loss itself (the HF
        ``Trainer`` does).
        """
        self.grads.begin_backward(self.is_gradient_accumulation_boundary())
        # Averaging over ranks and micro-batches is folded into the scale: the reduction sums.
        accumulation = self.gradient_accumulation_steps() if scale_wrt_gas else 1
        scale = self.loss_scaler.scale / (accumulation * self.communicator.world_size)
        with engine_backward():
            (loss.float() * scale).backward(retain_graph=retain_graph)
        self.grads.finish_backward()
        if self.stage3 is not None:
            self.stage3.finish_backward()
        self._check_memory("in backward")
        return loss

    def step(self, lr_kwargs: dict[str, Any] | None = None) -> None:
        """Count a micro-batch; at an accumulation boundary, update the parameters.

        ``lr_kwargs`` go to the scheduler's ``step`` (e.g. a metric for ReduceLROnPlateau).
        """
        boundary = self.is_gradient_accumulation_boundary()
        if boundary:
            self._optimizer_step(lr_kwargs or {})
            self.global_steps += 1
        self.micro_steps += 1
        observer = hooks.current()
        if boundary and observer is not None:
            observer.on_optimizer_step(self)

    def is_gradient_accumulation_boundary(self) -> bool:
        """Whether this micro-batch ends an accumulation window: as the client set it, else
        every ``gradient_accumulation_steps``-th micro-batch."""
        if self._boundary is not None:
            return self._boundary
        return (self.micro_steps + 1) % self.gradient_accumulation_steps() == 0

    def set_gradient_accumulation_boundary(self, is_boundary: bool) -> None:
        """Say whether the coming backward ends the window, as DeepSpeed lets a client do that
        then calls ``step()`` once per window (Accelerate does, for the HF ``Trainer`` too)."""
        self._boundary = bool(is_boundary)

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Drop the gradients accumulated so far: the next backward starts a window."""
        del set_to_none
        self.grads.zero()

    @contextmanager
    def no_sync(self) -> Iterator[None]:
        """Accumulate without reducing, for clients that ask (Accelerate's ``accumulate``):
        the engine reduces only at the boundary anyway. Refused from ZeRO-2 on, whose
        gradients are partitioned every micro-batch, as DeepSpeed refuses it."""
        if self.zero.stage >= 2:
            raise RuntimeError(
                f"no_sync() is not supported at ZeRO stage {self.zero.stage}: its gradients "
                "are partitioned as they are produced (DeepSpeed refuses it too)"
            )
        yield

    def compile(self, *args: Any, **kwargs: Any) -> None:
        """DeepSpeed's ``engine.compile()``, which Accelerate calls where torch compile is
        turned on: refused, as the engine's hooks and saved-tensor packing are not compiled."""
        del args, kwargs
        raise NotImplementedError(
            "DeepSpeed's engine.compile() is not served by autotune's built-in engine: turn "
            "torch compile off (Accelerate's dynamo_backend, the Trainer's --torch_compile)"
        )

    def destroy(self) -> None:
        """Release the engine's hold on the model: its gradient and gathering hooks. The model
        keeps this rank's parameters as the engine left them (at stage 3, its shards)."""
        for hook in self._hooks:
            hook.remove()
        self._hooks = []
        if self.stage3 is not None:
            self.stage3.remove_hooks()
        _ENGINES.discard(self)

    def _optimizer_step(self, lr_kwargs: dict[str, Any]) -> None:
        scale = self.loss_scaler.scale
        fp16 = self.dtype == torch.float16
        clipping = float(self.config.gradient_clipping)
        grad_scale = 1.0 / scale
        # Scripts log the norm (get_global_grad_norm), so it is taken every step: one pass over
        # the shard and a tiny all-reduce. It is read on the host (a CUDA sync) only when
        # clipping or the fp16 overflow check needs it.
        self._grad_norm = self._global_grad_norm() / scale
        needs_norm = fp16 or clipping > 0
        norm = float(self._grad_norm) if needs_norm else 0.0
        self._step_skipped = fp16 and not math.isfinite(norm)
        self.optimizer.overflow = self._step_skipped  # type: ignore[attr-defined]
        if self._step_skipped:
            self.skipped_steps += 1
            self.loss_scaler.update(overflow=True)
            self.grads.zero()
            return
        clip = clipping / (norm + 1e-6)
        if clipping > 0 and clip < 1.0:
            grad_scale *= clip
        self.loss_scaler.update(overflow=False)
        self.master.step(grad_scale)
        self.grads.zero()
        if self.lr_scheduler is not None:
            with warnings.catch_warnings():
                # A client scheduler re-bound to the engine's optimizer (initialize) cannot
                # see that optimizer's step being called; torch would warn that it was not.
                warnings.filterwarnings("ignore", message=_SCHEDULER_ORDER_WARNINGS)
                self.lr_scheduler.step(**lr_kwargs)
        self._publish_params()
        self._check_memory("in the optimizer step")

    def _global_grad_norm(self) -> torch.Tensor:
        square_sum = self.master.grad_square_sum()
        if self.zero.stage > 0:
            square_sum = self.communicator.sum_small(square_sum)
        return square_sum.sqrt()

    def _publish_params(self) -> None:
        """Make every rank's updated shard visible to all (stages 1-3)."""
        if self.stage3 is not None:
            self.stage3.invalidate()
        elif self.zero.stage > 0:
            self._all_gather_params()

    def _all_gather_params(self) -> None:
        """Gather the updated shards in rounds of ``allgather_bucket_size`` elements.

        A round is one collective over column ranges of segments: one all-gather, or a
        broadcast per rank when ``allgather_partitions`` is false (DeepSpeed's alternative).
        Two rounds are in flight at a time, which bounds the staging memory of a backend that
        needs the pieces side by side.
        """
        assert self._flat_params is not None
        flat, layout, n = self._flat_params, self.layout, self.communicator.world_size
        handles: list[Any] = []
        for round_ in layout.gather_chunks(self.zero.allgather_bucket_numel):
            if len(handles) == 2:
                handles.pop(0).wait()
            pieces = [segment_rows(flat, layout.segments[s], n)[:, a:b] for s, a, b in round_]
            if self.zero.allgather_partitions:
                handles.append(self.communicator.all_gather_rows(pieces))
            else:
                handles.append(self.communicator.broadcast_rows(pieces))
        for handle in handles:
            handle.wait()

    def _check_memory(self, where: str) -> None:
        """At a point every rank reaches in step: raise OOM on all ranks if any is over budget.

        Deciding together (one tiny all-reduce) keeps a rank that fits from waiting forever in
        the next collective for a rank that stopped.
        """
        if self.memory_tracker.budget_bytes is None:
            return
        if self.communicator.any_rank(self.memory_tracker.exceeded()):
            raise self.memory_tracker.out_of_memory(where)

    def owns(self, param: torch.Tensor) -> bool:
        """Whether ``param`` is one this engine trains."""
        return id(param) in self._param_ids

    @contextmanager
    def gathered_parameters(
        self, params: Sequence[nn.Parameter], modifier_rank: int | None
    ) -> Iterator[None]:
        """``params`` whole for the block; what ``modifier_rank`` writes to them is kept.

        On exit the modifier's values are broadcast, written into every rank's shard and its
        fp32 master copy, so the next step trains from them.
        """
        params = [p for p in params if self.owns(p)]
        if self.stage3 is None:
            yield
            if modifier_rank is not None:
                self._take_modified(params, modifier_rank)
            return
        with self.stage3.gathered(self.stage3.units_of(params)), self._saved_plainly():
            yield
            if modifier_rank is not None:
                self._take_modified(params, modifier_rank)

    @contextmanager
    def _saved_plainly(self) -> Iterator[None]:
        """Inside the block, what autograd saves is saved as it would be without the engine.

        A parameter saved whole then comes back in backward as the same object, as with
        DeepSpeed: a client that gathered it for a forward of its own (TRL's fused LM head)
        reads its ``ds_status`` there and gathers it again. Saved through the engine's
        saved-tensor hooks it would come back as a new tensor. The hooks are on top of
        autograd's stack while the engine's forward runs: they are taken off for the block
        and put back after it (what is saved in the block is not counted as activations).
        """
        autograd = torch._C._autograd
        top = autograd._top_saved_tensors_default_hooks(True)
        if top is None or top != (self._pack, self._unpack):
            yield
            return
        autograd._pop_saved_tensors_default_hooks()
        try:
            yield
        finally:
            autograd._push_saved_tensors_default_hooks(*top)

    @torch.no_grad()
    def _take_modified(self, params: Sequence[nn.Parameter], modifier_rank: int) -> None:
        if self.communicator.group is not None:
            source = dist.get_global_rank(self.communicator.group, modifier_rank)
            for param in params:
                dist.broadcast(param.data, source, group=self.communicator.group)
        if self.stage3 is not None:
            self.stage3.store_gathered()
        self.master.reload()

    def peak_memory_bytes(self) -> int:
        """Peak device bytes of this rank: the CUDA allocator's, or the accounted peak on CPU."""
        return self.memory_tracker.peak_bytes()

    def memory_breakdown(self) -> dict[str, int]:
        """Device bytes held now, by kind (params, grads, optimizer_state, ...)."""
        return dict(self.memory_tracker.current)

    @property
    def loss_scale(self) -> float:
        return self.loss_scaler.scale

    # --- checkpoints ----------------------------------------------------------------------

    def save_checkpoint(
        self,
        save_dir: str | Path,
        tag: str | None = None,
        client_state: dict[str, Any] | None = None,
        save_latest: bool = True,
        exclude_frozen_parameters: bool = False,
    ) -> bool:
        """Save everything needed to resume bit-for-bit under ``save_dir/<tag>`` (default
        ``global_step<N>``) and, with ``save_latest``, point ``save_dir/latest`` at it (last,
        so it only ever names a complete checkpoint). Every rank must call this.

        ``exclude_frozen_parameters`` leaves out the parameters the engine does not train (a
        PEFT model's base); loading keeps the model's own values for them.
        """
        checkpoint.save(
            self, save_dir, tag, dict(client_state or {}), save_latest, exclude_frozen_parameters
        )
        return True

    def load_checkpoint(
        self,
        load_dir: str | Path,
        tag: str | None = None,
        load_module_strict: bool = True,
        load_optimizer_states: bool = True,
        load_lr_scheduler_states: bool = True,
        load_module_only: bool = False,
        custom_load_fn: Any = None,
    ) -> tuple[str | None, dict[str, Any] | None]:
        """Restore a checkpoint (``tag``, else the one ``load_dir/latest`` names); returns
        ``(path, client_state)``, or ``(None, None)`` when there is none yet.

        A checkpoint of another world size, stage or bucket layout is re-sharded. With
        ``load_module_strict`` false, weights the checkpoint lacks keep the model's values and
        weights the model lacks are ignored.

        Raises:
            CheckpointError: it is missing or incomplete, or was saved with another precision,
                optimizer or set of trained parameters.
        """
        if custom_load_fn is not None:
            raise ValueError("load_checkpoint(custom_load_fn=...) is not supported")
        return checkpoint.load(
            self,
            load_dir,
            tag,
            load_optimizer_states=load_optimizer_states,
            load_lr_scheduler_states=load_lr_scheduler_states,
            load_module_only=load_module_only,
            load_module_strict=load_module_strict,
        )

    # --- consolidated weights -------------------------------------------------------------

    @contextmanager
    def _full_params(self) -> Iterator[None]:
        if self.stage3 is None:
            yield
        else:
            with self.stage3.gathered():
                yield

    def module_state_dict(self) -> dict[str, torch.Tensor]:
        """The model's full, unsharded state dict (on CPU), on every rank."""
        with self._full_params():
            return {k: v.detach().cpu().clone() for k, v in self.module.state_dict().items()}

    def _zero3_consolidated_16bit_state_dict(
        self, exclude_frozen_parameters: bool = False
    ) -> dict[str, torch.Tensor] | None:
        """The whole model's state dict in its training dtype on rank 0, None on the others
        (every rank must call it), as DeepSpeed's: what ``trainer.save_model()`` writes."""
        state = self.module_state_dict()
        if exclude_frozen_parameters:
            frozen = {n for n, p in self.module.named_parameters() if not p.requires_grad}
            state = {k: v for k, v in state.items() if k not in frozen}
        return state if self.communicator.rank == 0 else None

    def save_model_state_dict(self, path: str | Path) -> None:
        """Write the full state dict to ``path`` from rank 0 (every rank must call this)."""
        state = self.module_state_dict()
        if self.communicator.rank == 0:
            torch.save(state, path)
        if self.communicator.group is not None:
            dist.barrier(group=self.communicator.group)

    @torch.no_grad()
    def load_model_state_dict(self, source: str | Path | dict[str, torch.Tensor]) -> None:
        """Load full weights (a path or a state dict) on every rank, into shards and master."""
        state = torch.load(source, map_location="cpu") if not isinstance(source, dict) else source
        with self._full_params():
            self.module.load_state_dict(state)
            if self.stage3 is not None:
                self.stage3.store_gathered()
        self.master.reload()
        if self.stage3 is not None:
            self.stage3.invalidate()


def engines_owning(
    params: Sequence[torch.Tensor],
) -> list[tuple[ZeroEngine, list[nn.Parameter]]]:
    """The live engines that train any of ``params``, each with its own of them (tensors no
    engine trains are in none)."""
    found = []
    for engine in list(_ENGINES):
        own = [p for p in params if isinstance(p, nn.Parameter) and engine.owns(p)]
        if own:
            found.append((engine, own))
    return found
