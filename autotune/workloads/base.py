"""What a workload is: a model whose forward returns a loss, and a way to make its batches."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

MakeBatch = Callable[[int, torch.Generator], tuple[Any, ...]]
"""``make_batch(micro_batch_size, generator)`` → the positional inputs of one micro-batch."""


@dataclass(frozen=True)
class Workload:
    """A model to train and the synthetic (or user-made) data to train it on.

    Attributes:
        model: An ``nn.Module`` whose ``forward(*inputs)`` returns a scalar loss tensor.
        make_batch: ``make_batch(micro_batch_size, generator)`` returns the tuple of positional
            inputs for one micro-batch. Built-in workloads create their tensors on
            ``generator.device``, so a CUDA generator gives CUDA inputs.
        activation_checkpointing: switches the model's activation checkpointing on (True)
            or off, where the workload can: ``autotune plan`` measures both ways on one
            model instead of building it twice. None: it cannot.
    """

    model: nn.Module
    make_batch: MakeBatch
    activation_checkpointing: Callable[[bool], None] | None = None
