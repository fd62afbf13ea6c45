"""The process group the engine talks over, and a count of every collective it issues.

All collectives go through :class:`Communicator`, so tests can see what each knob changes
(how many all-reduces a bucket size causes, whether they start during backward) and a world
of one rank skips communication entirely instead of needing a process group.

On gloo, reduce-scatter and all-gather are built from other collectives, because gloo's own
``reduce_scatter_tensor`` / ``all_gather_into_tensor`` stage through lists of tensors and are
two to four times slower than its all-reduce. Measured on 2 CPU cores, world size 2, 27M fp32
elements: all-reduce 99 ms; reduce-scatter 204 ms as gloo's, 92 ms as an all-to-all plus a
local sum; all-gather 239 ms as gloo's, 66 ms as one broadcast per rank. (Point-to-point
isend/irecv was faster still, 84 and 53 ms, but gloo then sometimes aborted at process exit.)
On gloo ``allgather_partitions`` therefore changes nothing but the name in the log.
"""

from __future__ import annotations

import os
import weakref
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from autotune.engine.backward_span import in_backward
from autotune.engine.memory_tracker import MemoryTracker, tensor_bytes

# torch 2.13 renamed the flat-tensor collectives (the old names warn); torch 2.4 lacks the new.
_reduce_scatter_single = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
_all_gather_single = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


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
    """Something to wait on; a finished no-op when there is nothing to wait for.

    ``then`` runs once, after the works are done (e.g. summing what a reduce-scatter received).
    """

    def __init__(self, *works: dist.Work | None, then: Callable[[], None] | None = None) -> None:
        self._works = [w for w in works if w is not None]
        self._then = then

    def wait(self) -> None:
        for work in self._works:
            work.wait()
        self._works = []
        if self._then is not None:
            then, self._then = self._then, None
            then()


class Communicator:
    """Collectives over one process group (``None`` for a world of one rank).

    Every method takes the whole tensor it reduces or gathers and is asynchronous: it returns
    a :class:`Handle`. With one rank the data is already complete and nothing is sent.
    """

    def __init__(
        self, group: dist.ProcessGroup | None, tracker: MemoryTracker | None = None
    ) -> None:
        # A group of one (init_distributed() in a lone process) has nothing to exchange;
        # without it nothing is sent, as in a process that never made a group.
        if group is not None and dist.get_world_size(group) == 1:
            group = None
        # Weakly: once the group is destroyed nothing may keep it alive. A ProcessGroup that
        # outlives destroy_process_group keeps its connections open (a warm process would never
        # tell a peer that it left) and is torn down during interpreter shutdown, where gloo
        # aborts the process after a script that trained fine.
        self._group = weakref.ref(group) if group is not None else None
        self.rank = dist.get_rank(group) if group is not None else 0
        self.world_size = dist.get_world_size(group) if group is not None else 1
        self.log = CollectiveLog()
        self.tracker = tracker
        # Reduce-scatter and all-gather from other collectives where the backend's own are
        # the slow ones (gloo).
        self.exchange = group is not None and dist.get_backend(group) == dist.Backend.GLOO
        self._ranks = [
            dist.get_global_rank(group, r) for r in range(self.world_size) if group is not None
        ]
        # Receive buffers of all-to-alls, reused: a fresh buffer of tens of MB costs as much in
        # page faults as sending it.
        self._free: list[torch.Tensor] = []

    @property
    def group(self) -> dist.ProcessGroup | None:
        """The group (None for a world of one).

        Raises:
            RuntimeError: the group was destroyed (at exit, or by the caller) and the engine
                is used after it.
        """
        if self._group is None:
            return None
        group = self._group()
        if group is None:
            raise RuntimeError("the engine's process group was destroyed; the engine cannot talk")
        return group

    @property
    def stages_reduce_scatter(self) -> bool:
        """Whether a reduce-scatter needs a receive buffer as large as what it reduces."""
        return self.exchange

    def _record(self, kind: str, numel: int) -> None:
        self.log.calls[kind] += 1
        self.log.numel[kind] += numel
        if in_backward():
            self.log.calls_in_backward[kind] += 1

    def all_reduce(self, tensor: torch.Tensor) -> Handle:
        """Sum ``tensor`` over ranks, in place."""
        if self.group is None:
            return Handle()
        self._record("all_reduce", tensor.numel())
        return Handle(dist.all_reduce(tensor, group=self.group, async_op=True))

    def reduce_scatter(
        self, output: torch.Tensor, tensor: torch.Tensor, *, accumulate: bool = False
    ) -> Handle:
        """``output`` = the sum over ranks of this rank's ``1/world_size`` slice of ``tensor``.

        With ``accumulate`` the sum is added to ``output`` instead. ``output`` may be this
        rank's slice of ``tensor`` itself (an in-place reduce-scatter).
        """
        if self.group is None:
            if accumulate:
                output.add_(tensor)
            elif output.data_ptr() != tensor.data_ptr():
                output.copy_(tensor)
            return Handle()
        self._record("reduce_scatter", tensor.numel())
        if self.exchange:
            return self._exchange_reduce_scatter(output, tensor, accumulate)
        if not accumulate:
            return Handle(_reduce_scatter_single(output, tensor, group=self.group, async_op=True))
        target = torch.empty_like(output)
        work = _reduce_scatter_single(target, tensor, group=self.group, async_op=True)

        def add() -> None:
            output.add_(target)

        return Handle(work, then=add)

    def _exchange_reduce_scatter(
        self, output: torch.Tensor, tensor: torch.Tensor, accumulate: bool
    ) -> Handle:
        # Row r of every rank's tensor goes to rank r (an all-to-all); each rank then sums
        # the rows it received.
        rows = tensor.view(self.world_size, -1)
        received = self._acquire(tensor.numel(), tensor)
        work = dist.all_to_all_single(received, tensor, group=self.group, async_op=True)
        received_rows = received.view(self.world_size, -1)

        def total() -> None:
            # Sum in rank order (the same on every rank), then accumulate the sum, as
            # adding a reduce-scatter's result would.
            parts = [rows[r] if r == self.rank else received_rows[r] for r in range(len(rows))]
            target = received_rows[self.rank] if accumulate else output
            if len(parts) == 1:  # a group of one rank: its own row is the sum
                target.copy_(parts[0])
            else:
                torch.add(parts[0], parts[1], out=target)
            for part in parts[2:]:
                target.add_(part)
            if accumulate:
                output.add_(target)
            self._release(received)

        return Handle(work, then=total)

    def all_gather(self, output: torch.Tensor, shard: torch.Tensor) -> Handle:
        """``output`` = every rank's ``shard``, concatenated in rank order.

        ``shard`` may already be this rank's slice of ``output`` (an in-place all-gather).
        """
        rows = output.view(self.world_size, -1)
        if shard.data_ptr() != rows[self.rank].data_ptr():
            rows[self.rank].copy_(shard.view(-1))
        if self.group is None:
            return Handle()
        self._record("all_gather", output.numel())
        if not self.exchange:
            return Handle(
                _all_gather_single(output, rows[self.rank], group=self.group, async_op=True)
            )
        return self._broadcast_each([rows])

    def _broadcast_each(self, pieces: list[torch.Tensor]) -> Handle:
        """Row ``r`` of every piece from rank ``r`` to all: the all-gather of exchanges."""
        works = []
        for rank, global_rank in enumerate(self._ranks):
            for piece in pieces:
                works.append(
                    dist.broadcast(piece[rank], global_rank, group=self.group, async_op=True)
                )
        return Handle(*works)

    def _acquire(self, numel: int, like: torch.Tensor) -> torch.Tensor:
        """A receive buffer of ``numel`` elements: a free one that fits, else a new one."""
        for index, buffer in enumerate(self._free):
            if buffer.dtype == like.dtype and buffer.numel() >= numel:
                return self._free.pop(index)[:numel]
        # Free buffers too small for this are dropped, so the pool stays as large as the most
        # that was ever in flight at once.
        for buffer in [b for b in self._free if b.dtype == like.dtype]:
            self._free.remove(buffer)
            self._account(-tensor_bytes(buffer))
        buffer = torch.empty(numel, dtype=like.dtype, device=like.device)
        self._account(tensor_bytes(buffer))
        return buffer

    def _account(self, nbytes: int) -> None:
        if self.tracker is not None:
            self.tracker.add("buffers", nbytes)

    def _release(self, view: torch.Tensor) -> None:
        base = view._base if view._base is not None else view
        self._free.append(base)

    def all_gather_rows(self, pieces: list[torch.Tensor]) -> Handle:
        """One all-gather of several ``[world_size, k]`` views, in place.

        Row ``r`` of every piece is rank ``r``'s data; this rank's row is filled in, the rest
        arrive. Rows must each be contiguous (the pieces need not be): that is what a column
        range of a segment's rows is.
        """
        if self.group is None:
            return Handle()
        self._record("all_gather", sum(piece.numel() for piece in pieces))
        if self.exchange:
            return self._broadcast_each(pieces)
        if len(pieces) == 1 and pieces[0].is_contiguous():
            rows = pieces[0]
            work = _all_gather_single(
                rows.view(-1), rows[self.rank], group=self.group, async_op=True
            )
            return Handle(work)
        # The backend gathers one contiguous buffer: stage the pieces side by side.
        width = sum(piece.shape[1] for piece in pieces)
        staging = torch.empty(
            self.world_size, width, dtype=pieces[0].dtype, device=pieces[0].device
        )
        self._account(tensor_bytes(staging))
        column = 0
        for piece in pieces:
            staging[self.rank, column : column + piece.shape[1]].copy_(piece[self.rank])
            column += piece.shape[1]
        work = _all_gather_single(
            staging.view(-1), staging[self.rank], group=self.group, async_op=True
        )

        def unstage() -> None:
            start = 0
            for piece in pieces:
                piece.copy_(staging[:, start : start + piece.shape[1]])
                start += piece.shape[1]
            self._account(-tensor_bytes(staging))

        return Handle(work, then=unstage)

    def broadcast_rows(self, pieces: list[torch.Tensor]) -> Handle:
        """Like :meth:`all_gather_rows`, as one broadcast from each rank of its rows."""
        if self.group is None:
            return Handle()
        works = []
        for rank in range(self.world_size):
            self._record("broadcast", sum(piece.shape[1] for piece in pieces))
            source = dist.get_global_rank(self.group, rank)
            for piece in pieces:
                works.append(dist.broadcast(piece[rank], source, group=self.group, async_op=True))
        return Handle(*works)

    def broadcast_from_first(self, tensors: list[torch.Tensor]) -> None:
        """Overwrite ``tensors`` with rank 0's values: one blocking broadcast per dtype.

        The dtypes go in order of first appearance in ``tensors``, never a set's order: a
        set of dtypes iterates by the objects' addresses, which differ between processes, so
        ranks would post the broadcasts in different orders (sizes) and gloo aborts one.
        """
        if self.group is None:
            return
        tensors = [t for t in tensors if t.numel() > 0]
        source = dist.get_global_rank(self.group, 0)
        for dtype in dict.fromkeys(t.dtype for t in tensors):
            same = [t for t in tensors if t.dtype == dtype]
            flat = torch.cat([t.detach().reshape(-1) for t in same])
            dist.broadcast(flat, source, group=self.group)
            with torch.no_grad():
                for tensor, piece in zip(same, flat.split([t.numel() for t in same]), strict=True):
                    tensor.copy_(piece.view_as(tensor))

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

    def sum_small(self, value: torch.Tensor) -> torch.Tensor:
        """``value`` (a small tensor: a norm, a few partial sums) summed over ranks, blocking.

        Returned on ``value``'s device; NCCL needs it on the GPU for the trip.
        """
        if self.group is None:
            return value
        self._record("all_reduce", value.numel())
        sent = value
        if dist.get_backend(self.group) == dist.Backend.NCCL and value.device.type != "cuda":
            sent = value.cuda()
        dist.all_reduce(sent, group=self.group)
        return sent.to(value.device)


def local_cuda_device() -> torch.device:
    """This rank's GPU, made the current device: ``LOCAL_RANK``'s where a launcher set it (as
    DeepSpeed's engine picks it, for scripts that start NCCL themselves and never choose a
    GPU), else the current one."""
    local = os.environ.get("LOCAL_RANK")
    if local is not None:
        torch.cuda.set_device(int(local) % torch.cuda.device_count())
    return torch.device("cuda", torch.cuda.current_device())
