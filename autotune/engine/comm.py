"""The process group the engine talks over, and a count of every collective it issues.

All collectives go through :class:`Communicator`, so tests can see what each knob changes
(how many all-reduces a bucket size causes, whether they start during backward) and a world
of one rank skips communication entirely instead of needing a process group.
"""

from __future__ import annotations

import os
from collections import Counter
from dataclasses import dataclass, field

import torch
import torch.distributed as dist


@dataclass
class CollectiveLog:
    """What the engine sent: calls and elements per kind of collective."""

    calls: Counter[str] = field(default_factory=Counter)
    numel: Counter[str] = field(default_factory=Counter)
    # Calls issued while autograd was running a backward pass (overlap with compute).
    calls_in_backward: Counter[str] = field(default_factory=Counter)

    def clear(self) -> None:
        self.calls.clear()
        self.numel.clear()
        self.calls_in_backward.clear()


class Handle:
    """Something to wait on; a finished no-op when there is nothing to wait for."""

    def __init__(self, *works: dist.Work | None) -> None:
        self._works = [w for w in works if w is not None]

    def wait(self) -> None:
        for work in self._works:
            work.wait()
        self._works = []


class Communicator:
    """Collectives over one process group (``None`` for a world of one rank).

    Every method takes the whole tensor it reduces or gathers and is asynchronous: it returns
    a :class:`Handle`. With one rank the data is already complete and nothing is sent.
    """

    def __init__(self, group: dist.ProcessGroup | None) -> None:
        self.group = group
        self.rank = dist.get_rank(group) if group is not None else 0
        self.world_size = dist.get_world_size(group) if group is not None else 1
        self.log = CollectiveLog()

    def _record(self, kind: str, numel: int) -> None:
        self.log.calls[kind] += 1
        self.log.numel[kind] += numel
        if torch._C._current_graph_task_id() != -1:
            self.log.calls_in_backward[kind] += 1

    def all_reduce(self, tensor: torch.Tensor) -> Handle:
        """Sum ``tensor`` over ranks, in place."""
        if self.group is None:
            return Handle()
        self._record("all_reduce", tensor.numel())
        return Handle(dist.all_reduce(tensor, group=self.group, async_op=True))

    def reduce_scatter(self, output: torch.Tensor, tensor: torch.Tensor) -> Handle:
        """``output`` = the sum over ranks of this rank's ``1/world_size`` slice of ``tensor``."""
        if self.group is None:
            output.copy_(tensor)
            return Handle()
        self._record("reduce_scatter", tensor.numel())
        return Handle(dist.reduce_scatter_tensor(output, tensor, group=self.group, async_op=True))

    def all_gather(self, output: torch.Tensor, shard: torch.Tensor) -> Handle:
        """``output`` = every rank's ``shard``, concatenated in rank order."""
        if self.group is None:
            output.copy_(shard)
            return Handle()
        self._record("all_gather", output.numel())
        return Handle(dist.all_gather_into_tensor(output, shard, group=self.group, async_op=True))

    def broadcast_rows(self, rows: torch.Tensor) -> Handle:
        """Row ``r`` of ``rows`` from rank ``r`` to everyone: one broadcast per rank."""
        if self.group is None:
            return Handle()
        works = []
        for rank in range(self.world_size):
            self._record("broadcast", rows.shape[1])
            source = dist.get_global_rank(self.group, rank)
            works.append(dist.broadcast(rows[rank], source, group=self.group, async_op=True))
        return Handle(*works)

    def any_rank(self, flag: bool) -> bool:
        """True when ``flag`` is true on at least one rank (a small blocking all-reduce)."""
        if self.group is None:
            return flag
        value = torch.tensor([1.0 if flag else 0.0])
        if dist.get_backend(self.group) == dist.Backend.NCCL:
            value = value.cuda()
        self._record("all_reduce", 1)
        dist.all_reduce(value, op=dist.ReduceOp.MAX, group=self.group)
        return bool(value.item() > 0)

    def sum_scalar(self, value: torch.Tensor) -> torch.Tensor:
        """``value`` (a 1-element tensor) summed over ranks, blocking."""
        if self.group is None:
            return value
        self._record("all_reduce", 1)
        dist.all_reduce(value, group=self.group)
        return value


def resolve_group(process_group: dist.ProcessGroup | None) -> dist.ProcessGroup | None:
    """The group to train over: the caller's, the default one, or one made from torchrun's env.

    Returns ``None`` for a single process with no launcher, which then trains alone without
    any collective.
    """
    if process_group is not None:
        return process_group
    if dist.is_available() and dist.is_initialized():
        return dist.group.WORLD
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    if world_size == 1:
        return None
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    # env:// reads RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT, as torchrun sets them.
    dist.init_process_group(backend, init_method="env://")
    if backend == "nccl":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    return dist.group.WORLD
