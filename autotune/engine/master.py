"""The parameters one rank updates, in fp32, and the optimizer that updates them.

The optimizer never sees the model's parameters. It sees this rank's *owned* pieces of the
flat parameter buffer (whole segments at stage 0, the rank's chunks from stage 1 on), split
into sub-groups of at most ``sub_group_size`` elements. In fp32 without offload those pieces
are views of the model's own storage, so a step updates the model in place and there is no
second copy. With bf16/fp16, or with the optimizer offloaded to the host, an fp32 master copy
is kept (on the host when offloaded); each sub-group's gradients are converted and stepped on
their own, so the fp32 temporaries never exceed one sub-group.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from autotune.config import OptimizerConfig
from autotune.engine.memory import MemoryTracker, tensor_bytes
from autotune.engine.optimizers import build_optimizer


class MasterParams:
    """The optimizer over this rank's owned parameters.

    Args:
        owned: this rank's pieces of the model parameters (compute dtype, model device).
        owned_grads: the matching gradient pieces, already reduced across ranks.
        offload: keep the fp32 master, the optimizer state and the step on the host.
        sub_group_numel: the largest tensor the optimizer steps at once.
    """

    def __init__(
        self,
        owned: Sequence[torch.Tensor],
        owned_grads: Sequence[torch.Tensor],
        config: OptimizerConfig | None,
        tracker: MemoryTracker,
        *,
        offload: bool,
        sub_group_numel: int,
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
        # (owned piece, start, stop) of every sub-group, and the optimizer's tensor for it.
        self.pieces: list[tuple[int, int, int]] = []
        for index, base in enumerate(bases):
            for start in range(0, base.numel(), sub_group_numel):
                self.pieces.append((index, start, min(base.numel(), start + sub_group_numel)))
        self.params = [nn.Parameter(bases[i][a:b], requires_grad=True) for i, a, b in self.pieces]
        self.optimizer = build_optimizer(config, list(self.params))
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
            for piece, param in enumerate(self.params):
                grad = self._grad(piece).to(device=param.device, dtype=torch.float32)
                self._account("buffers", tensor_bytes(grad))
                grad.mul_(grad_scale)
                param.grad = grad
                self.optimizer.step()
                param.grad = None
                self._account("buffers", -tensor_bytes(grad))
                index, start, stop = self.pieces[piece]
                self.owned[index][start:stop].copy_(param.detach(), non_blocking=True)
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

    def grad_square_sum(self) -> torch.Tensor:
        """Sum of squares of this rank's gradients, in fp32 (for norms and overflow checks)."""
        norms = [torch.linalg.vector_norm(g, dtype=torch.float32) for g in self.owned_grads]
        return torch.stack(norms).square().sum().reshape(1)

    @torch.no_grad()
    def reload(self) -> None:
        """Copy the owned model parameters into the fp32 master (after loading weights)."""
        if self.separate:
            self.flat.copy_(torch.cat([piece.reshape(-1) for piece in self.owned]))
