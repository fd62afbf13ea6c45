"""Device memory: accounting that works without a GPU.

The ZeRO model-state formulas it is held to are torch-free, in :mod:`autotune.model_states`.

On CUDA the allocator knows the truth and :class:`MemoryTracker` reads it. On CPU the tracker
adds up what the engine holds (parameters, gradients, optimizer state, flat buffers, gathered
parameters) and the activations autograd saves for backward, so a memory budget behaves as a
GPU's would: exceed it and training raises ``torch.OutOfMemoryError``.
"""

from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import Callable, Iterator

import torch

# What the tracker counts, by kind. "host" bytes (offloaded optimizer) are reported apart and
# never count against the device budget.
KINDS = ("params", "grads", "master", "optimizer_state", "buffers", "gathered", "activations")


def tensor_bytes(tensor: torch.Tensor) -> int:
    return tensor.numel() * tensor.element_size()


class MemoryTracker:
    """Current and peak device bytes of one rank, by kind.

    Args:
        device: where training runs; on CUDA peaks come from the allocator.
        budget_bytes: the per-rank device memory; ``exceeded()`` compares the peak with it.
    """

    def __init__(self, device: torch.device, budget_bytes: int | None = None) -> None:
        self.device = device
        self.budget_bytes = budget_bytes
        self.current: Counter[str] = Counter()
        self.host: Counter[str] = Counter()
        self.peak_accounted = 0
        self.peak_by_kind: Counter[str] = Counter()  # e.g. the most activations held at once
        self._total = 0
        # The allocator's peak is per process: without a reset, an engine built in a warm
        # process (a Ray actor, after an earlier or out-of-memory experiment) would report,
        # and be judged over budget by, an earlier engine's peak.
        self.reset_peak()

    def add(self, kind: str, nbytes: int) -> None:
        """Account ``nbytes`` more (or fewer, when negative) device bytes of ``kind``."""
        self.current[kind] += nbytes
        if nbytes > 0:
            self.peak_by_kind[kind] = max(self.peak_by_kind[kind], self.current[kind])
        self._total += nbytes
        self.peak_accounted = max(self.peak_accounted, self._total)

    def add_host(self, kind: str, nbytes: int) -> None:
        """Bytes kept in host memory (offload): reported, never charged to the device."""
        self.host[kind] += nbytes

    @property
    def accounted_bytes(self) -> int:
        return self._total

    def peak_bytes(self) -> int:
        """Peak device bytes: the allocator's on CUDA, the accounted peak elsewhere."""
        if self.device.type == "cuda":
            return int(torch.cuda.max_memory_allocated(self.device))
        return self.peak_accounted

    def reset_peak(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
        self.peak_accounted = self._total

    def exceeded(self) -> bool:
        return self.budget_bytes is not None and self.peak_bytes() > self.budget_bytes

    def out_of_memory(self, where: str) -> torch.OutOfMemoryError:
        """The error a GPU would raise, with the numbers that caused it."""
        return torch.OutOfMemoryError(
            f"device memory budget exceeded {where}: peak {self.peak_bytes()} bytes > "
            f"{self.budget_bytes} bytes per rank (held now: {dict(self.current)})"
        )


class ActivationTracker:
    """Counts the bytes autograd saves for backward, once per storage, while they are alive.

    Used as ``torch.autograd.graph.saved_tensors_hooks(tracker.pack, tracker.unpack)``.
    Storages the engine already accounts (flat parameter buffers) are skipped.
    """

    def __init__(self, tracker: MemoryTracker) -> None:
        self._tracker = tracker
        self._refs: Counter[int] = Counter()
        self.excluded: set[int] = set()
        self._over_budget: Callable[[], None] | None = None  # see deciding_early

    def pack(self, tensor: torch.Tensor) -> object:
        storage = tensor.untyped_storage()
        key = storage.data_ptr()
        if key in self.excluded or tensor.device.type == "cuda":
            return tensor
        if self._refs[key] == 0:
            self._tracker.add("activations", storage.nbytes())
            if self._over_budget is not None and self._tracker.exceeded():
                self._tracker.add("activations", -storage.nbytes())  # never saved
                self._over_budget()
        self._refs[key] += 1
        return _Saved(tensor, key, storage.nbytes(), self)

    @contextlib.contextmanager
    def deciding_early(self, over_budget: Callable[[], None] | None) -> Iterator[None]:
        """Inside, a saved tensor that takes the account over the budget calls
        ``over_budget`` (which raises the out-of-memory error), as a GPU's allocator raises at
        the allocation that does not fit; None: the caller decides after its forward.

        Otherwise an out-of-memory probe far over the budget first runs its whole forward,
        holding every activation in host RAM: measured on 2 cores, 7.6 s of an experiment
        at 128 samples of the default gpt. The engine's ``over_budget`` all-reduces, so ranks
        still decide together: a peer meets that all-reduce where it goes over too, or at
        its forward's end. Only for a forward with no collective of its own, then (not
        stage 3's, which gathers parameters), and not backward's recomputation.
        """
        self._over_budget = over_budget
        try:
            yield
        finally:
            self._over_budget = None

    @staticmethod
    def unpack(saved: object) -> torch.Tensor:
        return saved.tensor if isinstance(saved, _Saved) else saved  # type: ignore[return-value]

    def _release(self, key: int, nbytes: int) -> None:
        self._refs[key] -= 1
        if self._refs[key] == 0:
            del self._refs[key]
            self._tracker.add("activations", -nbytes)


class _Saved:
    """A saved activation; when autograd drops it, its bytes leave the account."""

    __slots__ = ("_owner", "key", "nbytes", "tensor")

    def __init__(
        self, tensor: torch.Tensor, key: int, nbytes: int, owner: ActivationTracker
    ) -> None:
        self.tensor, self.key, self.nbytes, self._owner = tensor, key, nbytes, owner

    def __del__(self) -> None:
        self._owner._release(self.key, self.nbytes)
