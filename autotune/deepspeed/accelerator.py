"""``deepspeed.accelerator.get_accelerator()``, the part training scripts call.

DeepSpeedExamples pick their device with ``get_accelerator().device_name(local_rank)``:
``"cuda:<i>"`` with CUDA, ``"cpu"`` (whatever the index) without, as DeepSpeed's CUDA and
CPU accelerators answer. A script then moves batches there and they meet the engine's
parameters on the same device.

Example:
    >>> from autotune.deepspeed.accelerator import get_accelerator
    >>> get_accelerator().device_name(0)   # on a machine without CUDA
    'cpu'
"""

from __future__ import annotations

import functools
from typing import Any

import torch


class Accelerator:
    """The machine's accelerator: CUDA when torch has a GPU, else the CPU."""

    def __init__(self) -> None:
        self._name = "cuda" if torch.cuda.is_available() else "cpu"

    def device_name(self, device_index: int | None = None) -> str:
        """``"cuda:<i>"`` (``"cuda"`` without an index), or ``"cpu"`` for any index."""
        if self._name == "cpu" or device_index is None:
            return self._name
        return f"cuda:{device_index}"

    def current_device_name(self) -> str:
        return self.device_name(self.current_device() if self._name == "cuda" else None)

    def current_device(self) -> int:
        return torch.cuda.current_device() if self._name == "cuda" else 0

    def set_device(self, device_index: int) -> None:
        if self._name == "cuda":
            torch.cuda.set_device(device_index)

    def device_count(self) -> int:
        return torch.cuda.device_count() if self._name == "cuda" else 1

    def is_available(self) -> bool:
        return True

    def communication_backend_name(self) -> str:
        return "nccl" if self._name == "cuda" else "gloo"

    def is_bf16_supported(self) -> bool:
        return torch.cuda.is_bf16_supported() if self._name == "cuda" else True

    def is_fp16_supported(self) -> bool:
        return True

    def synchronize(self, device_index: int | None = None) -> None:
        if self._name == "cuda":
            torch.cuda.synchronize(device_index)

    def manual_seed(self, seed: int) -> None:
        torch.manual_seed(seed)

    def manual_seed_all(self, seed: int) -> None:
        torch.manual_seed(seed)

    def empty_cache(self) -> None:
        if self._name == "cuda":
            torch.cuda.empty_cache()

    def memory_allocated(self, device_index: Any = None) -> int:
        return torch.cuda.memory_allocated(device_index) if self._name == "cuda" else 0

    def max_memory_allocated(self, device_index: Any = None) -> int:
        return torch.cuda.max_memory_allocated(device_index) if self._name == "cuda" else 0


@functools.cache
def get_accelerator() -> Accelerator:
    return Accelerator()


__all__ = ["Accelerator", "get_accelerator"]
