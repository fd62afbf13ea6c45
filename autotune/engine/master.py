"""The parameters one rank updates, in fp32, and the optimizer that updates them.

The optimizer never sees the model's parameters. It sees this rank's *owned* pieces of the
flat parameter buffer (whole segments at stage 0, the rank's chunks from stage 1 on), split
into sub-groups of at most ``sub_group_size`` elements. In fp32 without offload those pieces
are views of the model's own storage, so a step updates the model in place and there is no
second copy. With bf16/fp16, or with the optimizer offloaded to the host, an fp32 master copy
is kept (on the host when offloaded); each sub-group's gradients are converted and stepped on
their own, so the fp32 temporaries never exceed one sub-group (except for Lamb, whose norms
span sub-groups: its step converts them all at once).

A sub-group never spans two of the caller's param groups, so each keeps its own options (no
weight decay on norms and biases, a lower learning rate for embeddings, ...).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from autotune.config import OptimizerConfig
from autotune.engine.memory_tracker import MemoryTracker, tensor_bytes
from autotune.engine.optimizers import Lamb, SumOverRanks, build_optimizer, needs_whole_tensors

OptimizerFactory = Callable[[list[dict[str, Any]]], torch.optim.Optimizer]


@dataclass(frozen=True)
class ParamGroups:
    """The caller's param groups: each one's optimizer options, and each parameter's group.

    Parameters are numbered as in the flat layout.
    """

    options: tuple[dict[str, Any], ...]
    of_param: tuple[int, ...]


class MasterParams:
    """The optimizer over this rank's owned parameters.

    Args:
        owned: this rank's pieces of the model parameters (compute dtype, model device).
        owned_grads: the matching gradient pieces, already reduced across ranks.
        params_in: for each owned piece, ``(param, begin, end)`` of the parameters in it.
        groups: the param groups; the optimizer gets one per group, with its options.
        offload: keep the fp32 master, the optimizer state and the step on the host.
        sub_group_numel: the largest tensor the optimizer steps at once.
        sum_over_ranks: sums a small tensor over the ranks that share parameters (None when
            this rank owns whole parameters): for optimizers with per-parameter norms.
        optimizer_factory: builds the optimizer from the param groups over the owned pieces
            instead of ``config`` (a client optimizer passed to ``initialize``).
    """

    def __init__(
        self,
        owned: Sequence[torch.Tensor],
        owned_grads: Sequence[torch.Tensor],
        params_in: Sequence[Sequence[tuple[int, int, int]]],
        groups: ParamGroups,
        config: OptimizerConfig | None,
        tracker: MemoryTracker,
        *,
        offload: bool,
        sub_group_numel: int,
        sum_over_ranks: SumOverRanks | None = None,
        optimizer_factory: OptimizerFactory | None = None,
    ) -> None:
        self.owned, self.owned_grads = list(owned), list(owned_grads)
        self.tracker, self.offload = tracker, offload
        self.separate = offload or owned[0].dtype != torch.float32
        device = torch.device("cpu") if offload else owned[0].device
        if self.separate:
            self.flat = torch.cat([piece.detach().reshape(-1) for piece in owned]).to(
                device=device, dtype=torch.float32
            )
            self._account("master", tensor_bytes(self.flat))
            bases = list(self.flat.split([piece.numel() for piece in owned]))
        else:
            bases = self.owned
        whole_tensors = needs_whole_tensors(config)
        # (owned piece, start, stop) of every sub-group, its group and (per-tensor optimizers)
        # its parameter. A sub-group never spans two groups; padding belongs to none.
        self.pieces: list[tuple[int, int, int]] = []
        piece_group: list[int] = []
        piece_param: list[int] = []
        for index, ranges in enumerate(params_in):
            for param, start, stop, group in _runs(ranges, groups.of_param, whole_tensors):
                for a in range(start, stop, sub_group_numel):
                    self.pieces.append((index, a, min(stop, a + sub_group_numel)))
                    piece_group.append(group)
                    piece_param.append(param)
        self.params = [nn.Parameter(bases[i][a:b], requires_grad=True) for i, a, b in self.pieces]
        members: list[list[torch.Tensor]] = [[] for _ in groups.options]
        for tensor, group in zip(self.params, piece_group, strict=True):
            members[group].append(tensor)
        param_groups = [
            {**options, "params": params}
            for options, params in zip(groups.options, members, strict=True)
        ]
        if optimizer_factory is None:
            self.optimizer = build_optimizer(config, param_groups)
        else:
            self.optimizer = optimizer_factory(param_groups)
            if not isinstance(self.optimizer, torch.optim.Optimizer):
                raise TypeError(
                    "initialize(optimizer=...) must build a torch.optim.Optimizer, got "
                    f"{type(self.optimizer).__name__}"
                )
            if isinstance(self.optimizer, Lamb):
                raise ValueError(
                    "Lamb needs whole parameters per tensor; choose it in the config "
                    '("optimizer": {"type": "Lamb"}) rather than as initialize(optimizer=...)'
                )
        # An optimizer with per-parameter norms steps over all pieces at once: its norms span
        # them (and it may talk to the other ranks, which must then all be in the same step).
        self._step_whole = whole_tensors
        if isinstance(self.optimizer, Lamb):
            self.optimizer.shard_norms(
                dict(zip(self.params, piece_param, strict=True)),
                len(groups.of_param),
                sum_over_ranks,
            )
        self._state_accounted = False

    def _account(self, kind: str, nbytes: int) -> None:
        if self.offload:
            self.tracker.add_host(kind, nbytes)
        else:
            self.tracker.add(kind, nbytes)

    def _grad(self, piece: int) -> torch.Tensor:
        index, start, stop = self.pieces[piece]
        return self.owned_grads[index][start:stop]

    def step(self, grad_scale: float) -> None:
        """One optimizer step with every gradient multiplied by ``grad_scale`` first."""
        if not self.separate:
            grads = [self._grad(i) for i in range(len(self.pieces))]
            if grad_scale != 1.0:
                torch._foreach_mul_(grads, grad_scale)
            for param, grad in zip(self.params, grads, strict=True):
                param.grad = grad
            self.optimizer.step()
        else:
            # fp32 copies of the gradients, one sub-group at a time where the optimizer allows
            # (the other sub-groups have no gradient, so a step leaves them alone).
            everything = range(len(self.pieces))
            for batch in [everything] if self._step_whole else [[i] for i in everything]:
                self._step_separate(batch, grad_scale)
        for param in self.params:
            param.grad = None
        if not self._state_accounted:
            self._state_accounted = True
            state = self.optimizer.state.values()
            self._account(
                "optimizer_state",
                sum(
                    tensor_bytes(t)
                    for s in state
                    for t in s.values()
                    if isinstance(t, torch.Tensor) and t.numel() > 1
                ),
            )

    def _step_separate(self, pieces: Sequence[int], grad_scale: float) -> None:
        grads = [
            self._grad(i).to(device=self.params[i].device, dtype=torch.float32) for i in pieces
        ]
        nbytes = sum(tensor_bytes(g) for g in grads)
        self._account("buffers", nbytes)
        for piece, grad in zip(pieces, grads, strict=True):
            self.params[piece].grad = grad.mul_(grad_scale)
        self.optimizer.step()
        for piece in pieces:
            self.params[piece].grad = None
            index, start, stop = self.pieces[piece]
            self.owned[index][start:stop].copy_(self.params[piece].detach(), non_blocking=True)
        self._account("buffers", -nbytes)

    def grad_square_sum(self) -> torch.Tensor:
        """Sum of squares of this rank's gradients, in fp32 (for norms and overflow checks)."""
        norms = [torch.linalg.vector_norm(g, dtype=torch.float32) for g in self.owned_grads]
        return torch.stack(norms).square().sum().reshape(1)

    @torch.no_grad()
    def reload(self) -> None:
        """Copy the owned model parameters into the fp32 master (after loading weights)."""
        if self.separate:
            self.flat.copy_(torch.cat([piece.reshape(-1) for piece in self.owned]))


def _runs(
    ranges: Sequence[tuple[int, int, int]], group_of: Sequence[int], per_param: bool
) -> Iterator[tuple[int, int, int, int]]:
    """``(param, start, stop, group)`` runs of a piece: adjacent parameters of one group
    merged into one run (param then -1), unless every parameter must stay on its own."""
    run: list[int] | None = None
    for param, begin, end in ranges:
        group = group_of[param]
        if run is not None and not per_param and run[3] == group and run[2] == begin:
            run[0], run[2] = -1, end
            continue
        if run is not None:
            yield run[0], run[1], run[2], run[3]
        run = [param, begin, end, group]
    if run is not None:
        yield run[0], run[1], run[2], run[3]
