"""Script mode's rank side (:mod:`autotune.runner.script`), without a process group."""

from __future__ import annotations

from typing import Any

import torch
from torch.utils.data import DataLoader, TensorDataset

from autotune.runner.script import WindowDone, loader_workers_stopped


class _EngineLike:
    """Holds a loader in a reference cycle, as DeepSpeed's engine holds the one it built."""

    def __init__(self, loader: DataLoader[Any]) -> None:
        self.me = self
        self.batches = (batch for batch in loader)


def test_a_loader_left_in_a_cycle_has_its_workers_stopped_as_the_block_ends() -> None:
    # The script stops inside its loop, as WindowDone stops it; its loader's iterator stays
    # alive in a cycle that only the garbage collector would free (and then slowly: 5 s a
    # worker, its queues closed first).
    dataset = TensorDataset(torch.arange(64).view(32, 2))
    iterators: list[Any] = []
    try:
        with loader_workers_stopped():
            engine = _EngineLike(DataLoader(dataset, batch_size=4, num_workers=2))
            next(engine.batches)
            iterators.append(engine.batches.gi_frame.f_locals[".0"])  # the loader's iterator
            raise WindowDone
    except WindowDone:
        pass
    (iterator,) = iterators
    assert len(iterator._workers) == 2
    assert all(not worker.is_alive() for worker in iterator._workers)
    # Loaders made after the block are the caller's own again.
    later = iter(DataLoader(dataset, batch_size=4, num_workers=1))
    next(later)
    assert later._workers[0].is_alive()
    del later
