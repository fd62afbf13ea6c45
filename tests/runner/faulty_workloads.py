"""Workloads that fail on purpose, named ``tests.runner.faulty_workloads:<fn>`` in specs.

Each wraps the tiny gpt so the engine sees a real model until the fault fires.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn

from autotune.workloads import Workload, resolve_workload

TINY_GPT = {"n_layer": 1, "d_model": 64, "n_head": 2, "seq_len": 32, "vocab": 256}


class _Faulty(nn.Module):
    def __init__(
        self, inner: nn.Module, fault: str, rank_to_fail: int, seconds: float, signal_name: str
    ) -> None:
        super().__init__()
        self.inner = inner
        self.fault, self.rank_to_fail, self.seconds = fault, rank_to_fail, seconds
        self.signal = signal.Signals[signal_name]
        self.calls = 0

    def forward(self, *inputs: Any) -> torch.Tensor:
        self.calls += 1
        rank = int(torch.distributed.get_rank()) if torch.distributed.is_initialized() else 0
        if self.calls >= 2 and rank in (self.rank_to_fail, -1):
            if self.fault == "raise":
                raise ValueError(f"deliberate failure on rank {rank}")
            if self.fault == "sleep":
                time.sleep(self.seconds)
            if self.fault == "kill":
                os.kill(os.getpid(), self.signal)
        return self.inner(*inputs)


def faulty(
    fault: str = "raise",
    rank_to_fail: int = 1,
    seconds: float = 600.0,
    signal: str = "SIGKILL",
    pid_dir: str | None = None,
) -> Workload:
    """The tiny gpt with ``fault`` (raise | sleep | kill: send itself ``signal``) at its second
    forward on one rank; built in a rank, it writes its process id into ``pid_dir``."""
    if pid_dir is not None and torch.distributed.is_initialized():
        rank = torch.distributed.get_rank()
        Path(pid_dir, f"rank{rank}").write_text(str(os.getpid()))
    base = resolve_workload("gpt", TINY_GPT)
    return Workload(_Faulty(base.model, fault, rank_to_fail, seconds, signal), base.make_batch)


class _FaultyBySize(nn.Module):
    """Fails as ``faults`` says for the micro-batch (the batch dimension) it is given, in an
    experiment's rank only (the driver's profiling of the model, outside any process group,
    runs it too)."""

    def __init__(self, inner: nn.Module, faults: dict[int, str], rank_to_fail: int) -> None:
        super().__init__()
        self.inner, self.faults, self.rank_to_fail = inner, faults, rank_to_fail

    def forward(self, tokens: torch.Tensor, *rest: Any) -> torch.Tensor:
        fault = self.faults.get(int(tokens.shape[0]))
        in_rank = torch.distributed.is_initialized()
        if fault is not None and in_rank and torch.distributed.get_rank() == self.rank_to_fail:
            if fault == "raise":
                raise ValueError(f"deliberate failure at micro-batch {tokens.shape[0]}")
            if fault == "hang":
                time.sleep(3600)
            if fault == "kill":  # the rank kills itself
                os.kill(os.getpid(), signal.SIGKILL)
            if fault == "segfault":  # a real one: read address 0
                import ctypes

                ctypes.string_at(0)
            if fault == "oom":
                raise torch.OutOfMemoryError(f"out of memory at micro-batch {tokens.shape[0]}")
        return self.inner(tokens, *rest)


def faulty_by_micro_batch(faults: dict[str, str], rank_to_fail: int = 1) -> Workload:
    """The tiny gpt, failing at the micro-batches ``faults`` maps to raise | hang | kill |
    segfault | oom (keys are sizes, as JSON writes them) on one rank."""
    base = resolve_workload("gpt", TINY_GPT)
    by_size = {int(size): fault for size, fault in faults.items()}
    return Workload(_FaultyBySize(base.model, by_size, rank_to_fail), base.make_batch)


def with_loader_workers() -> Workload:
    """The tiny gpt, built after one pass over a DataLoader with a worker process: a rank
    that starts processes of its own, as a script's loader does."""
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.arange(4)),
                                         num_workers=1)  # fmt: skip
    assert len(list(loader)) == 4
    return resolve_workload("gpt", TINY_GPT)
