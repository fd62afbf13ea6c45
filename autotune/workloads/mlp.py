"""A stack of Linear + GELU layers classifying random vectors: the smallest workload."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from autotune.workloads.base import Workload


class MLP(nn.Module):
    """``n_layer`` Linear + GELU layers and a Linear output; ``forward(x, y)`` → cross-entropy."""

    def __init__(self, d_in: int, d_hidden: int, n_layer: int, d_out: int) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        width = d_in
        for _ in range(n_layer):
            layers += [nn.Linear(width, d_hidden), nn.GELU()]
            width = d_hidden
        layers.append(nn.Linear(width, d_out))
        self.net = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(self.net(x), y)


def build_mlp(d_in: int = 64, d_hidden: int = 256, n_layer: int = 3, d_out: int = 10) -> Workload:
    """The ``mlp`` workload: classify Gaussian vectors into random classes.

    Args:
        d_in: Input features.
        d_hidden: Width of the hidden layers.
        n_layer: Number of hidden Linear + GELU layers (0 makes it a linear classifier).
        d_out: Number of classes.

    Returns:
        The workload; ``make_batch`` gives ``(x, y)``: ``(B, d_in)`` float32 and ``(B,)`` int64.
    """
    for name, value in (("d_in", d_in), ("d_hidden", d_hidden), ("d_out", d_out)):
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")
    if not isinstance(n_layer, int) or n_layer < 0:
        raise ValueError(f"n_layer must be a non-negative integer, got {n_layer!r}")
    model = MLP(d_in, d_hidden, n_layer, d_out)

    def make_batch(micro_batch_size: int, generator: torch.Generator) -> tuple[torch.Tensor, ...]:
        x = torch.randn(micro_batch_size, d_in, generator=generator, device=generator.device)
        y = torch.randint(d_out, (micro_batch_size,), generator=generator, device=generator.device)
        return x, y

    return Workload(model=model, make_batch=make_batch)
