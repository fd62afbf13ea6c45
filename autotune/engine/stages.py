"""Building a ZeRO stage: which parameters the engine trains and how they are laid out.

Plain functions the engine calls once, when it is built: :func:`param_groups` picks the
parameters to train and their param groups, :func:`account_untrained` counts the rest of the
model, and :func:`build_stage` lays the trained ones out for the configured stage (one flat
buffer at stages 0-2, per-module shards at stage 3) with the gradients that go with them.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from autotune.engine.collectives import Communicator
from autotune.engine.grads import PartitionedGrads, ReplicatedGrads
from autotune.engine.memory_tracker import MemoryTracker, tensor_bytes
from autotune.engine.partition import FlatLayout, group_by_numel, param_views, segment_rows
from autotune.engine.settings import ZeroSettings
from autotune.engine.stage3 import Stage3Limits, Stage3Params, plan_units, tag_whole


@dataclass(frozen=True)
class Placement:
    """What every part of a stage is built with: the ZeRO settings, the communicator, the
    memory accounting, and the dtype and device the trained weights live in."""

    zero: ZeroSettings
    comm: Communicator
    memory: MemoryTracker
    dtype: torch.dtype
    device: torch.device


@dataclass
class StageParts:
    """What building a ZeRO stage makes, for the engine to keep."""

    params: list[nn.Parameter]  # trainable parameters in layout order
    owned: list[torch.Tensor]  # the pieces this rank's optimizer updates, one per segment
    params_in_owned: list[list[tuple[int, int, int]]]  # per owned piece, the parameters in it
    layout: FlatLayout
    grads: ReplicatedGrads | PartitionedGrads
    flat_params: torch.Tensor | None = None  # stages 0-2: the one buffer holding every weight
    stage3: Stage3Params | None = None


def param_groups(
    module: nn.Module, model_parameters: Iterable[Any] | None
) -> tuple[list[nn.Parameter], tuple[dict[str, Any], ...], dict[int, int]]:
    """The parameters to train (once each, in registration order), the options of each param
    group (one without options when none are given), and each parameter's group by ``id``."""
    if model_parameters is None:
        items: list[Any] = [p for p in module.parameters() if p.requires_grad]
    else:
        items = list(model_parameters)
    options: list[dict[str, Any]] = []
    group_of: dict[int, int] = {}
    loose: list[torch.Tensor] = []  # parameters given outside any group dict
    for item in items:
        if not isinstance(item, dict):
            loose.append(item)
            continue
        if "params" not in item:
            raise ValueError(f"param group {len(options)} of model_parameters has no 'params'")
        params = item["params"]
        members = [params] if isinstance(params, torch.Tensor) else list(params)
        _claim(members, len(options), group_of)
        options.append({k: v for k, v in item.items() if k != "params"})
    if loose:
        _claim(loose, len(options), group_of)
        options.append({})
    known = {id(p) for p in module.parameters()}
    if any(key not in known for key in group_of):
        raise ValueError("model_parameters holds a tensor that is not a parameter of the model")
    trainable = [p for p in module.parameters() if id(p) in group_of]
    if not trainable:
        raise ValueError("the model has no trainable parameters")
    return trainable, tuple(options), group_of


def _claim(params: list[torch.Tensor], group: int, group_of: dict[int, int]) -> None:
    for param in params:
        if id(param) in group_of:
            raise ValueError("a parameter appears in more than one param group")
        group_of[id(param)] = group


def account_untrained(
    module: nn.Module, trainable: list[nn.Parameter], memory: MemoryTracker
) -> None:
    """Count the model's frozen parameters and its buffers as held parameter bytes."""
    ids = {id(p) for p in trainable}
    frozen = [p for p in module.parameters() if id(p) not in ids]
    memory.add("params", sum(tensor_bytes(t) for t in [*frozen, *module.buffers()]))


def build_stage(module: nn.Module, trainable: list[nn.Parameter], at: Placement) -> StageParts:
    """Lay ``trainable`` out for ``at.zero.stage``, with its gradients and this rank's pieces."""
    if at.zero.stage < 3:
        return _build_flat(trainable, at)
    return _build_stage3(module, trainable, at)


def _build_flat(trainable: list[nn.Parameter], at: Placement) -> StageParts:
    """Stages 0-2: all parameters in one flat buffer, one segment per reduce bucket."""
    zero, comm, memory = at.zero, at.comm, at.memory
    n = comm.world_size
    # Backward produces gradients roughly in reverse order of registration; laying the
    # buffer out that way lets the first buckets fill (and be sent) first.
    params = list(reversed(trainable))
    numels = [p.numel() for p in params]
    layout = FlatLayout.build(
        numels, group_by_numel(numels, zero.reduce_bucket_numel), n if zero.stage > 0 else 1
    )
    flat = torch.zeros(layout.numel, dtype=at.dtype, device=at.device)
    memory.add("params", tensor_bytes(flat))
    for param, view in zip(
        params, param_views(flat, layout, [p.shape for p in params]), strict=True
    ):
        view.copy_(param.detach())
        param.data = view
    rows = [segment_rows(flat, s, layout.world_size) for s in layout.segments]
    grads: ReplicatedGrads | PartitionedGrads
    if zero.stage == 2:
        segments = range(len(layout.segments))
        grads = _partitioned_grads(layout, [range(s, s + 1) for s in segments], segments, at)
    else:
        grads = ReplicatedGrads(
            params,
            layout,
            comm,
            memory,
            overlap=zero.overlap_comm,
            scatter=zero.stage == 1 and zero.reduce_scatter,
            owned_rows=zero.stage == 1,
        )
    owned = [r.view(-1) for r in rows] if zero.stage == 0 else [r[comm.rank] for r in rows]
    params_in = _params_in_owned(layout, zero.stage, comm.rank)
    return StageParts(params, owned, params_in, layout, grads, flat_params=flat)


def _build_stage3(module: nn.Module, trainable: list[nn.Parameter], at: Placement) -> StageParts:
    """Stage 3: one segment per module's parameters, each rank keeping its chunks."""
    zero, comm = at.zero, at.comm
    units, persistent = plan_units(module, set(trainable), zero.persistence_threshold)
    params = [p for unit in units for p in unit]
    layout = FlatLayout.build([p.numel() for p in params], [len(u) for u in units], comm.world_size)
    limits = Stage3Limits(zero.prefetch_numel, zero.max_live_numel, zero.max_reuse_distance)
    stage3 = Stage3Params(module, units, persistent, layout, comm, at.memory, limits)
    # Parameters the engine does not train stay whole on every rank (a LoRA model's base).
    ids = {id(p) for p in params}
    tag_whole(p for p in module.parameters() if id(p) not in ids)
    sizes = group_by_numel([s.numel for s in layout.segments], zero.reduce_bucket_numel)
    starts = [sum(sizes[:i]) for i in range(len(sizes))]
    buckets = [range(start, start + size) for start, size in zip(starts, sizes, strict=True)]
    grads = _partitioned_grads(layout, buckets, reversed(range(len(buckets))), at)
    shard = stage3.shard
    owned = [shard[s.shard_offset : s.shard_offset + s.chunk] for s in layout.segments]
    params_in = _params_in_owned(layout, zero.stage, comm.rank)
    return StageParts(params, owned, params_in, layout, grads, stage3=stage3)


def _partitioned_grads(
    layout: FlatLayout,
    buckets: Sequence[range],
    order: Iterable[int],
    at: Placement,
) -> PartitionedGrads:
    """Stages 2 and 3: gradient shards, ``buckets`` of segments reduced in ``order``."""
    return PartitionedGrads(
        layout,
        at.comm,
        at.memory,
        at.dtype,
        at.device,
        buckets=buckets,
        order=list(order),
        scatter=at.zero.reduce_scatter,
        contiguous=at.zero.contiguous_gradients,
        overlap=at.zero.overlap_comm,
    )


def _params_in_owned(layout: FlatLayout, stage: int, rank: int) -> list[list[tuple[int, int, int]]]:
    """Per owned piece (whole segments at stage 0, this rank's chunks from stage 1 on),
    the parameters in it."""
    if stage == 0:
        return [layout.params_in(i, 0, s.numel) for i, s in enumerate(layout.segments)]
    return [
        layout.params_in(i, rank * s.chunk, (rank + 1) * s.chunk)
        for i, s in enumerate(layout.segments)
    ]
