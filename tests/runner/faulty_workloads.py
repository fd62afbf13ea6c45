"""Workloads that fail on purpose, named ``tests.runner.faulty_workloads:<fn>`` in specs.

Each wraps the tiny gpt so the engine sees a real model until the fault fires.
"""

from __future__ import annotations

import os
import signal
import time
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
    fault: str = "raise", rank_to_fail: int = 1, seconds: float = 600.0, signal: str = "SIGKILL"
) -> Workload:
    """The tiny gpt with ``fault`` (raise | sleep | kill: send itself ``signal``) at its second
    forward on one rank."""
    base = resolve_workload("gpt", TINY_GPT)
    return Workload(_Faulty(base.model, fault, rank_to_fail, seconds, signal), base.make_batch)
