"""Loading a checkpoint saved at another world size, ZeRO stage or bucket layout.

Every rank reads every saved shard and rebuilds, per parameter (by name), its fp32 master
values and each elementwise optimizer state (Adam's moments, ...), then takes the slices its
own pieces cover in the new layout. Scalar state (a step count) is the same in every piece
and is copied. The model's weights are the master values in the compute dtype, exactly what
the engine holds after each step, so a re-sharded run continues from the same numbers (the
reduction order across a different number of ranks may still change later sums).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch

from autotune.engine.partition import FlatLayout

if TYPE_CHECKING:
    from autotune.engine.engine import ZeroEngine

Piece = Sequence[int]  # (owned piece, start, stop)


def layout_of(shape: dict[str, Any]) -> FlatLayout:
    """The flat layout a checkpoint was saved with."""
    sizes = [end - first for first, end in shape["segments"]]
    world = shape["world_size"] if shape["stage"] > 0 else 1
    return FlatLayout.build(shape["param_numels"], sizes, world)


def _positions(
    layout: FlatLayout, stage: int, rank: int, piece: Piece
) -> list[tuple[int, int, int, int]]:
    """``(param, piece_begin, piece_end, param_offset)``: where a piece's elements lie in each
    parameter it covers (padding left out)."""
    index, start, stop = piece
    segment = layout.segments[index]
    base = rank * segment.chunk if stage > 0 else 0
    return [
        (param, begin, end, base + start + begin - layout.offset_in_segment(param))
        for param, begin, end in layout.params_in(index, base + start, base + stop)
    ]


def _owned_sources(
    shape: dict[str, Any], layout: FlatLayout, shard: dict[str, Any]
) -> list[torch.Tensor] | None:
    """A saved rank's owned pieces of fp32 master values; None when the model weights are
    the master (fp32 at stages 0-2, found in the model states file)."""
    if "master" in shard:
        segments = layout.segments
        sizes = [s.chunk if shape["stage"] > 0 else s.numel for s in segments]
        return list(shard["master"].split(sizes))
    if "param_shard" in shard:
        return [
            shard["param_shard"][s.shard_offset : s.shard_offset + s.chunk] for s in layout.segments
        ]
    return None


def gather_full(
    state: dict[str, Any], shards: Sequence[dict[str, Any]]
) -> tuple[dict[str, torch.Tensor], dict[str, dict[str, Any]]]:
    """Per parameter name: its fp32 master values (1-D), and its optimizer state."""
    shape = state["shape"]
    layout = layout_of(shape)
    names, stage = shape["param_names"], shape["stage"]
    master = {n: torch.zeros(numel) for n, numel in zip(names, shape["param_numels"], strict=True)}
    optim: dict[str, dict[str, Any]] = {n: {} for n in names}
    for rank, shard in enumerate(shards):
        sources = _owned_sources(shape, layout, shard)
        saved_state = shard["optimizer"]["state"]
        for piece, state_index in zip(shard["pieces"], shard["state_index"], strict=True):
            index, start, _ = piece
            piece_state = saved_state.get(state_index, {})
            for param, begin, end, offset in _positions(layout, stage, rank, piece):
                name, count = names[param], end - begin
                if sources is not None:
                    values = sources[index][start + begin : start + end]
                    master[name][offset : offset + count] = values.float()
                for key, value in piece_state.items():
                    if isinstance(value, torch.Tensor) and value.dim() == 1:
                        full = optim[name].setdefault(key, torch.zeros(master[name].numel()))
                        full[offset : offset + count] = value[begin:end].float()
                    else:
                        optim[name].setdefault(key, value)
    if not shards or _owned_sources(shape, layout, shards[0]) is None:
        for name in names:
            master[name] = state["module"][name].detach().reshape(-1).float()
    return master, optim


def restore(
    engine: ZeroEngine,
    state: dict[str, Any],
    shards: Sequence[dict[str, Any]],
    load_optimizer_states: bool,
) -> None:
    """Put a checkpoint of another shape into ``engine``'s layout."""
    master, optim = gather_full(state, shards)
    named = dict(engine.module.named_parameters())
    weights = dict(state["module"])
    for name, values in master.items():
        weights[name] = values.view(named[name].shape).to(named[name].dtype)
    engine.load_model_state_dict(weights)  # shards, stage-3 units and the master follow
    names = param_names(engine)
    rank, stage = engine.communicator.rank, engine.zero.stage
    pieces = engine.master.pieces
    new_state: dict[int, dict[str, Any]] = {}
    for piece, tensor, state_index in zip(
        pieces, engine.master.params, state_indices(engine), strict=True
    ):
        exact = torch.zeros(tensor.numel())
        moments: dict[str, Any] = {}
        for param, begin, end, offset in _positions(engine.layout, stage, rank, piece):
            name, count = names[param], end - begin
            exact[begin:end] = master[name][offset : offset + count]
            for key, value in optim[name].items():
                if isinstance(value, torch.Tensor) and value.dim() == 1:
                    moment = moments.setdefault(key, torch.zeros(tensor.numel()))
                    moment[begin:end] = value[offset : offset + count]
                else:
                    moments.setdefault(key, value)
        if engine.master.separate:  # the fp32 master exactly, not its rounded weights
            tensor.data.copy_(exact)
        if moments and load_optimizer_states:
            new_state[state_index] = moments
    if load_optimizer_states:
        fresh = engine.optimizer.state_dict()
        saved_groups = shards[0]["optimizer"]["param_groups"]
        groups = [
            {**{k: v for k, v in saved.items() if k != "params"}, "params": group["params"]}
            for saved, group in zip(saved_groups, fresh["param_groups"], strict=True)
        ]
        engine.optimizer.load_state_dict({"state": new_state, "param_groups": groups})


def param_names(engine: ZeroEngine) -> list[str]:
    """The trained parameters' names, in the engine's layout order."""
    name_of = {id(p): n for n, p in engine.module.named_parameters()}
    return [name_of[id(p)] for p in engine.params]


def state_indices(engine: ZeroEngine) -> list[int]:
    """For each optimizer tensor (in piece order), its index in the optimizer's state dict."""
    order = {
        id(p): i
        for i, p in enumerate(p for group in engine.optimizer.param_groups for p in group["params"])
    }
    return [order[id(p)] for p in engine.master.params]
