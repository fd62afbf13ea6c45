"""ZeRO stage 3: parameters partitioned across ranks, gathered only while a module needs them.

Each module's own parameters form a *unit*: one segment of the flat layout, gathered with a
single all-gather before the module's forward and released after it. Backward needs some of
them again; rather than hooking modules' backward, the saved-tensor hooks replace a gathered
parameter that autograd saves with a small reference and gather the unit again when autograd
unpacks it. A released parameter keeps its shape (its data is a one-element tensor expanded),
so ``p.shape`` and autograd's gradient accumulation still work.

The order in which units are fetched during the first micro-batch is recorded; afterwards that
trace drives prefetching (up to ``stage3_prefetch_bucket_size`` elements ahead), keeps units
whose next use is near (``stage3_max_reuse_distance``) and caps what is gathered at once
(``stage3_max_live_parameters``). Parameters smaller than
``stage3_param_persistence_threshold`` share one unit that is never released.

Every parameter of the model carries DeepSpeed's ZeRO-3 attributes, which clients read (TRL
gathers a parameter whose ``ds_status`` is not AVAILABLE, PEFT sizes layers by ``ds_shape``,
Lightning's model summary counts ``ds_numel`` and ``partition_numel()``): ``ds_id``,
``ds_numel``, ``ds_shape``, ``ds_tensor`` (this rank's part of it, a view of the shard) and
``ds_status``. The status says whether a client may use the data now: AVAILABLE while the
engine holds the unit whole for a use (its module's forward or backward, a
``GatheredParameters`` block, or always for a persistent unit), INFLIGHT while it is being
gathered, NOT_AVAILABLE otherwise, including a unit gathered ahead of need or kept for its next
use: the engine may release such a unit at its next fetch, so a client that wants it gathers it
(which then costs nothing). Parameters the engine does not train (a LoRA model's base) are held
whole on every rank: AVAILABLE always, and their ``ds_tensor`` is all of them.
"""

from __future__ import annotations

import enum
import itertools
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
from torch import nn

from autotune.engine.collectives import Communicator, Handle
from autotune.engine.memory_tracker import MemoryTracker, tensor_bytes
from autotune.engine.partition import FlatLayout, shard_piece


class ZeroParamStatus(enum.Enum):
    """Where a stage-3 parameter's data is, as DeepSpeed names it (its values too)."""

    AVAILABLE = 1  # whole on this rank, for a use (a module's, a GatheredParameters block's)
    NOT_AVAILABLE = 2  # partitioned, or gathered with no use holding it (may go any fetch)
    INFLIGHT = 3  # being gathered


# DeepSpeed numbers parameters once a process, in the order they are partitioned.
_param_ids = itertools.count()


def tag_whole(params: Iterable[nn.Parameter]) -> None:
    """Give parameters held whole on every rank the stage-3 attributes: AVAILABLE always."""
    for param in params:
        _tag(param, param.data.reshape(-1))
        param.ds_status = ZeroParamStatus.AVAILABLE  # type: ignore[attr-defined]


def _tag(param: nn.Parameter, local: torch.Tensor) -> None:
    param.ds_id = next(_param_ids)  # type: ignore[attr-defined]
    param.ds_numel = param.numel()  # type: ignore[attr-defined]
    param.ds_shape = param.shape  # type: ignore[attr-defined]
    param.ds_tensor = local  # type: ignore[attr-defined]
    param.partition_numel = local.numel  # type: ignore[attr-defined]


@dataclass(frozen=True)
class Stage3Limits:
    """The stage-3 knobs, in elements."""

    prefetch_numel: int
    max_live_numel: int
    max_reuse_distance: int


@dataclass
class _Unit:
    segment: int
    params: list[nn.Parameter]
    numel: int
    persistent: bool
    full: torch.Tensor | None = None
    handle: Handle | None = None
    active: bool = False  # a module's forward, or backward, is using it right now
    pins: int = 0  # GatheredParameters blocks holding it whole
    grads_left: int = 0
    views: list[torch.Tensor] = field(default_factory=list)


@dataclass(frozen=True)
class _UnitRef:
    """What autograd keeps instead of a gathered parameter it saved for backward."""

    unit: int
    offset: int
    size: torch.Size
    stride: tuple[int, ...]


def plan_units(
    module: nn.Module, trainable: set[nn.Parameter], persistence_threshold: int
) -> tuple[list[list[nn.Parameter]], list[bool]]:
    """Parameters grouped into units: one per module's own parameters, small ones together.

    The persistent unit (parameters under ``persistence_threshold``) comes first, so it lands in
    the last gradient bucket: its gradients only complete at the end of backward.
    """
    persistent: list[nn.Parameter] = []
    units: list[list[nn.Parameter]] = []
    seen: set[nn.Parameter] = set()
    for sub in module.modules():
        own: list[nn.Parameter] = []
        for param in sub.parameters(recurse=False):
            if param in seen or param not in trainable:
                continue
            seen.add(param)
            (persistent if param.numel() < persistence_threshold else own).append(param)
        if own:
            units.append(own)
    groups = ([persistent] if persistent else []) + units
    return groups, [True] * bool(persistent) + [False] * len(units)


class Stage3Params:
    """Owns the partitioned parameters and gathers them around each module's use.

    Args:
        module: the model (hooks go on every module that owns a unit).
        units: parameters of each unit, in layout order; ``persistent`` flags each unit.
        layout: one segment per unit.
    """

    def __init__(
        self,
        module: nn.Module,
        units: Sequence[list[nn.Parameter]],
        persistent: Sequence[bool],
        layout: FlatLayout,
        comm: Communicator,
        tracker: MemoryTracker,
        limits: Stage3Limits,
    ) -> None:
        self.layout, self.comm, self.tracker, self.limits = layout, comm, tracker, limits
        first = units[0][0]
        self.dtype, self.device = first.dtype, first.device
        self.shard = torch.empty(layout.shard_numel, dtype=self.dtype, device=self.device)
        tracker.add("params", tensor_bytes(self.shard))
        self._placeholder = torch.full((1,), float("nan"), dtype=self.dtype, device=self.device)
        self.units: list[_Unit] = []
        self._unit_of_param: dict[nn.Parameter, int] = {}
        for index, (params, keep) in enumerate(zip(units, persistent, strict=True)):
            segment = layout.segments[index]
            self.units.append(_Unit(index, list(params), segment.numel, keep))
            for param in params:
                self._unit_of_param[param] = index
            self._partition(index)
        self._by_storage: dict[int, int] = {}
        self._live_numel = 0
        self.peak_live_numel = 0  # most gathered (non-persistent) elements at once
        self.prefetched = 0  # units gathered ahead of need
        self.peak_ahead_numel = 0  # most elements gathered ahead of need at once
        self._trace: list[int] = []
        self._recording = True
        self._cursor = 0
        self._hooks = self._install_hooks(module)
        self._tag_params()
        self.gather_persistent()

    # --- setting up -----------------------------------------------------------------------

    def _partition(self, index: int) -> None:
        """Keep this rank's chunk of the unit and drop the full parameters."""
        unit, segment = self.units[index], self.layout.segments[index]
        full = torch.zeros(segment.numel, dtype=self.dtype, device=self.device)
        for param, view in zip(unit.params, self._views(full, unit), strict=True):
            view.copy_(param.detach())
        shard_piece(self.shard, segment).copy_(full.view(self.comm.world_size, -1)[self.comm.rank])
        self._release_data(unit)

    def _tag_params(self) -> None:
        """DeepSpeed's attributes on every partitioned parameter; ``ds_tensor`` is the part of
        it in this rank's chunk of its unit (empty when the chunk holds none of it)."""
        layout, rank = self.layout, self.comm.rank
        for unit in self.units:
            segment = layout.segments[unit.segment]
            chunk = shard_piece(self.shard, segment)
            lo, hi = rank * segment.chunk, (rank + 1) * segment.chunk
            for index, param in zip(segment.params, unit.params, strict=True):
                begin = layout.offset_in_segment(index)
                start = min(max(begin, lo), hi) - lo
                stop = max(min(begin + param.numel(), hi), lo) - lo
                _tag(param, chunk[start:stop])
                param.ds_status = ZeroParamStatus.NOT_AVAILABLE  # type: ignore[attr-defined]

    def _views(self, full: torch.Tensor, unit: _Unit) -> list[torch.Tensor]:
        layout = self.layout
        return [
            full[layout.offset_in_segment(i) : layout.offset_in_segment(i) + p.numel()].view(
                p.shape
            )
            for i, p in zip(layout.segments[unit.segment].params, unit.params, strict=True)
        ]

    def _install_hooks(self, module: nn.Module) -> list[torch.utils.hooks.RemovableHandle]:
        hooks = []
        for sub in module.modules():
            owned = sorted(
                {
                    self._unit_of_param[p]
                    for p in sub.parameters(recurse=False)
                    if p in self._unit_of_param
                    and not self.units[self._unit_of_param[p]].persistent
                }
            )
            if owned:
                hooks.append(sub.register_forward_pre_hook(self._pre_forward(owned)))
                hooks.append(sub.register_forward_hook(self._post_forward(owned)))
        return hooks

    def _pre_forward(self, owned: list[int]) -> Callable[[nn.Module, object], None]:
        def hook(module: nn.Module, args: object) -> None:
            for unit in owned:
                self.fetch(unit)

        return hook

    def _post_forward(self, owned: list[int]) -> Callable[[nn.Module, object, object], None]:
        def hook(module: nn.Module, args: object, output: object) -> None:
            for unit in owned:
                self.done(unit)

        return hook

    # --- gather and release ---------------------------------------------------------------

    def _start_gather(self, index: int) -> None:
        unit = self.units[index]
        if unit.full is not None:
            return
        segment = self.layout.segments[index]
        full = torch.empty(segment.numel, dtype=self.dtype, device=self.device)
        self.tracker.add("params" if unit.persistent else "gathered", tensor_bytes(full))
        unit.handle = self.comm.all_gather(full, shard_piece(self.shard, segment))
        unit.full = full
        self._publish(unit)
        self._by_storage[full.untyped_storage().data_ptr()] = index
        if not unit.persistent:
            self._live_numel += unit.numel
            self.peak_live_numel = max(self.peak_live_numel, self._live_numel)

    def _wait(self, index: int) -> torch.Tensor:
        unit = self.units[index]
        assert unit.full is not None
        if unit.handle is not None:
            unit.handle.wait()
            unit.handle = None
            unit.views = self._views(unit.full, unit)
            for param, view in zip(unit.params, unit.views, strict=True):
                param.data = view
        self._publish(unit)
        return unit.full

    def _release(self, index: int) -> None:
        unit = self.units[index]
        if unit.full is None:
            return
        if unit.handle is not None:
            unit.handle.wait()
            unit.handle = None
        del self._by_storage[unit.full.untyped_storage().data_ptr()]
        self.tracker.add("params" if unit.persistent else "gathered", -tensor_bytes(unit.full))
        if not unit.persistent:
            self._live_numel -= unit.numel
        unit.full, unit.views = None, []
        self._release_data(unit)

    def _release_data(self, unit: _Unit) -> None:
        for param in unit.params:
            param.data = self._placeholder.expand(param.shape)
        self._publish(unit)

    def _publish(self, unit: _Unit) -> None:
        """The unit's parameters' ``ds_status``, from where its data is and who holds it."""
        if unit.full is None:
            status = ZeroParamStatus.NOT_AVAILABLE
        elif unit.handle is not None:
            status = ZeroParamStatus.INFLIGHT
        elif unit.persistent or unit.active or unit.pins:
            status = ZeroParamStatus.AVAILABLE
        else:  # gathered ahead of need or kept for reuse: the next fetch may release it
            status = ZeroParamStatus.NOT_AVAILABLE
        for param in unit.params:
            param.ds_status = status  # type: ignore[attr-defined]

    def _make_room(self, numel: int, keep: int) -> None:
        """Release idle gathered units until ``numel`` more fits under max_live_parameters."""
        for index, unit in enumerate(self.units):
            if self._live_numel + numel <= self.limits.max_live_numel:
                return
            idle = not unit.active and not unit.pins and not unit.persistent
            if index != keep and unit.full is not None and idle:
                self._release(index)

    # --- the protocol the engine and hooks follow --------------------------------------------

    def fetch(self, index: int) -> torch.Tensor:
        """Unit ``index`` made whole (waiting for it); prefetches what the trace says is next."""
        unit = self.units[index]
        if not unit.active and not unit.persistent:
            unit.active = True
            self._advance(index)
        if unit.full is None:
            self._make_room(unit.numel, keep=index)
            self._start_gather(index)
        self._prefetch()
        return self._wait(index)

    def done(self, index: int) -> None:
        """A module's forward (or backward) is done with the unit: release it unless reused soon."""
        unit = self.units[index]
        if unit.persistent or not unit.active:
            return
        unit.active = False
        if self._reuse_distance(index) > self.limits.max_reuse_distance and not unit.pins:
            self._release(index)
        else:
            self._publish(unit)

    def begin_micro_step(self) -> None:
        self._cursor = 0
        for unit in self.units:
            unit.grads_left = sum(p.requires_grad for p in unit.params)

    def grad_done(self, param: nn.Parameter) -> None:
        index = self._unit_of_param[param]
        unit = self.units[index]
        unit.grads_left -= 1
        if unit.grads_left == 0:
            self.done(index)

    def remove_hooks(self) -> None:
        """Stop gathering on forward (the engine is destroyed)."""
        for hook in self._hooks:
            hook.remove()
        self._hooks = []

    def finish_backward(self) -> None:
        """After backward: nothing but the persistent unit stays gathered."""
        for index, unit in enumerate(self.units):
            unit.active = False
            if not unit.persistent and not unit.pins:
                self._release(index)
            else:
                self._publish(unit)
        self._recording = False

    def gather_persistent(self) -> None:
        """Gather the units that stay whole: the persistent one, and any a GatheredParameters
        block holds."""
        for index, unit in enumerate(self.units):
            if unit.persistent or unit.pins:
                self._start_gather(index)
                self._wait(index)

    def invalidate(self) -> None:
        """The shards changed (a step): drop every gathered copy, gather again what stays
        whole."""
        for index in range(len(self.units)):
            self._release(index)
        self.gather_persistent()

    def units_of(self, params: Sequence[nn.Parameter]) -> list[int]:
        """The units holding ``params`` (each once, in layout order)."""
        return sorted({self._unit_of_param[p] for p in params if p in self._unit_of_param})

    @contextmanager
    def gathered(self, units: Sequence[int] | None = None) -> Iterator[None]:
        """Every parameter (or those of ``units``) whole for the duration.

        Units gathered before the block (a module's forward using them, kept for reuse,
        prefetched) stay gathered after it, as DeepSpeed keeps a parameter a module is using.
        """
        chosen = range(len(self.units)) if units is None else units
        fresh = [i for i in chosen if self.units[i].full is None]
        for index in chosen:
            self.units[index].pins += 1
            self._start_gather(index)
            self._wait(index)
        try:
            yield
        finally:
            for index in chosen:
                unit = self.units[index]
                unit.pins -= 1
                idle = not unit.persistent and not unit.active and not unit.pins
                if index in fresh and idle:
                    self._release(index)
                else:
                    self._publish(unit)

    @torch.no_grad()
    def store_gathered(self) -> None:
        """Copy this rank's chunk of every gathered unit back into the shard (after loading)."""
        for unit in self.units:
            if unit.full is not None:
                segment = self.layout.segments[unit.segment]
                shard_piece(self.shard, segment).copy_(
                    unit.full.view(self.comm.world_size, -1)[self.comm.rank]
                )

    # --- saved tensors --------------------------------------------------------------------

    def pack(self, tensor: torch.Tensor) -> _UnitRef | None:
        """A reference instead of ``tensor`` when it is a view of a releasable gathered unit."""
        index = self._by_storage.get(tensor.untyped_storage().data_ptr())
        if index is None:
            return None
        unit = self.units[index]
        if unit.persistent:
            return None
        assert unit.full is not None
        offset = int(tensor.storage_offset()) - int(unit.full.storage_offset())
        return _UnitRef(index, offset, tensor.size(), tensor.stride())

    def unpack(self, ref: _UnitRef) -> torch.Tensor:
        full = self.fetch(ref.unit)
        return torch.as_strided(full, ref.size, ref.stride, full.storage_offset() + ref.offset)

    def is_gathered_storage(self, tensor: torch.Tensor) -> bool:
        return tensor.untyped_storage().data_ptr() in self._by_storage

    # --- the trace ------------------------------------------------------------------------

    def _advance(self, index: int) -> None:
        if self._recording:
            self._trace.append(index)
            return
        trace = self._trace
        for step in range(len(trace)):
            position = (self._cursor + step) % len(trace)
            if trace[position] == index:
                self._cursor = position + 1
                return

    def _prefetch(self) -> None:
        """Gather the next units of the trace while at most ``stage3_prefetch_bucket_size``
        elements are gathered ahead of need. Units already gathered ahead (prefetched earlier,
        or kept for reuse) use up the bucket too; otherwise every fetch would reach a bucket
        further and the whole model would end up gathered."""
        if self._recording:
            return
        upcoming = [
            i for i in dict.fromkeys(self._trace[self._cursor :]) if not self.units[i].active
        ]
        ahead = sum(self.units[i].numel for i in upcoming if self.units[i].full is not None)
        for index in upcoming:
            unit = self.units[index]
            if unit.full is not None:
                continue
            if ahead + unit.numel > self.limits.prefetch_numel or (
                self._live_numel + unit.numel > self.limits.max_live_numel
            ):
                break
            self._start_gather(index)
            self.prefetched += 1
            ahead += unit.numel
        self.peak_ahead_numel = max(self.peak_ahead_numel, ahead)

    def _reuse_distance(self, index: int) -> int:
        """Elements fetched before ``index`` is needed again in this micro-batch (or never)."""
        if self._recording:
            return 1 << 62
        distance = 0
        for later in self._trace[self._cursor :]:
            if later == index:
                return distance
            distance += self.units[later].numel
        return 1 << 62

    @property
    def live_numel(self) -> int:
        return self._live_numel

    @property
    def trace(self) -> list[int]:
        return list(self._trace)
