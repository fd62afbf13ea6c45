"""Gradient reduction across ranks, in buckets, started from backward hooks.

Two strategies, both fed from each parameter's post-accumulate-grad hook:

* :class:`ReplicatedGrads` (stages 0 and 1): every rank keeps full gradients in one flat buffer;
  each ``param.grad`` is a view into it, so autograd accumulates micro-batches in place. At the
  accumulation boundary each bucket is all-reduced (stage 0) or reduce-scattered in place
  (stage 1, each rank only needs its own shard) as soon as its last gradient arrives.
* :class:`PartitionedGrads` (stages 2 and 3): every rank keeps only its shard of the gradients.
  Each micro-batch's gradients are copied into a bucket's staging buffer and freed at once; a
  full bucket is reduce-scattered into the shard.

Buckets are launched strictly in a fixed order, whatever order gradients arrive in, because
collectives must be issued in the same order on every rank.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from autotune.engine.backward_span import in_backward
from autotune.engine.collectives import Communicator, Handle
from autotune.engine.memory_tracker import MemoryTracker, tensor_bytes
from autotune.engine.partition import FlatLayout, param_views, segment_rows, shard_piece


@dataclass
class _InFlight:
    handle: Handle
    after: Callable[[], None] | None  # runs once the collective is done (accumulate, free)


class _OrderedLauncher:
    """Launches buckets in ``order`` as they become ready; waits for them on ``drain``.

    Args:
        max_in_flight: wait for the oldest collective before launching one more (bounds the
            receive buffers of a backend that stages, e.g. gloo's reduce-scatter exchange).
        synchronous: wait for each collective as soon as it is launched (no overlap with
            backward's compute, but memory freed bucket by bucket, as DeepSpeed does with
            ``overlap_comm`` off).
    """

    def __init__(
        self,
        order: Sequence[int],
        launch: Callable[[int], _InFlight],
        *,
        max_in_flight: int | None = None,
        synchronous: bool = False,
    ) -> None:
        self._order = list(order)
        self._launch = launch
        self._max_in_flight = max_in_flight
        self._synchronous = synchronous
        self._ready: set[int] = set()
        self._next = 0
        self.in_flight: deque[_InFlight] = deque()
        # Launches that backward's compute ran on past, still in flight (overlap at work).
        self.overlapped = 0

    def ready(self, bucket: int) -> None:
        self._ready.add(bucket)
        while self._next < len(self._order) and self._order[self._next] in self._ready:
            if self._max_in_flight is not None and len(self.in_flight) >= self._max_in_flight:
                self.wait_oldest()
            self.in_flight.append(self._launch(self._order[self._next]))
            self._next += 1
            if self._synchronous:
                self.wait_oldest()
            elif in_backward():
                self.overlapped += 1

    def launch_all(self) -> None:
        for bucket in self._order[self._next :]:
            self.ready(bucket)

    def wait_oldest(self) -> None:
        item = self.in_flight.popleft()
        item.handle.wait()
        if item.after is not None:
            item.after()

    def drain(self) -> None:
        while self.in_flight:
            self.wait_oldest()
        self._ready.clear()
        self._next = 0


class ReplicatedGrads:
    """Full gradients on every rank (stages 0 and 1), reduced once per accumulation window.

    Args:
        params: trainable parameters in layout order.
        layout: the flat layout; one segment per reduce bucket.
        scatter: reduce-scatter each bucket in place instead of all-reducing it (stage 1 with
            ``reduce_scatter``): a rank then only has its own shard's sum.
        overlap: launch a bucket from the hook of its last gradient (``overlap_comm``);
            otherwise all buckets are launched after backward.
    """

    def __init__(
        self,
        params: Sequence[torch.nn.Parameter],
        layout: FlatLayout,
        comm: Communicator,
        tracker: MemoryTracker,
        *,
        scatter: bool,
        overlap: bool,
        owned_rows: bool,
    ) -> None:
        self.layout, self.comm = layout, comm
        self.scatter, self.overlap = scatter, overlap
        first = params[0]
        self.flat = torch.zeros(layout.numel, dtype=first.dtype, device=first.device)
        tracker.add("grads", tensor_bytes(self.flat))
        self.params = list(params)
        self.views = param_views(self.flat, layout, [p.shape for p in params])
        self._rows = [segment_rows(self.flat, s, layout.world_size) for s in layout.segments]
        # What the optimizer on this rank reads: whole segments (stage 0) or its rows (stage 1).
        self.owned_grads = [r[comm.rank] if owned_rows else r.view(-1) for r in self._rows]
        self._sizes = [len(s.params) for s in layout.segments]
        self._pending = list(self._sizes)
        self._boundary = False
        # Which views hold a gradient of this accumulation window. A window's first gradient
        # is copied into its view rather than added to a zeroed one: zeroing the buffer and
        # accumulating would cost two more passes over it every step.
        self._written = [False] * len(params)
        # Two reductions in flight at most where each needs a receive buffer the size of its
        # bucket: launched all at once they would stage a second copy of every gradient.
        self._launcher = _OrderedLauncher(
            range(len(layout.segments)),
            self._launch,
            max_in_flight=2 if scatter and comm.stages_reduce_scatter else None,
        )

    @property
    def overlapped(self) -> int:
        """Reductions backward ran on past (0 without ``overlap_comm``)."""
        return self._launcher.overlapped

    def begin_backward(self, boundary: bool) -> None:
        self._boundary = boundary
        self._pending = list(self._sizes)

    def on_grad(self, index: int, param: torch.nn.Parameter) -> None:
        view = self.views[index]
        grad = param.grad
        if grad is not None and grad.data_ptr() != view.data_ptr():
            # A new gradient (the window's first, or .grad was replaced): into the buffer.
            if self._written[index]:
                view.add_(grad)
            else:
                view.copy_(grad)
            param.grad = view  # later micro-batches accumulate in place
        self._written[index] = self._written[index] or grad is not None
        segment = self.layout.param_segment[index]
        self._pending[segment] -= 1
        if self._pending[segment] == 0 and self._boundary and self.overlap:
            self._launcher.ready(segment)

    def finish_backward(self) -> None:
        """Reduce what is left and wait (at the boundary); keep accumulating otherwise."""
        if self._boundary:
            self._launcher.launch_all()
            self._launcher.drain()

    def _launch(self, segment: int) -> _InFlight:
        for index in self.layout.segments[segment].params:
            if not self._written[index]:  # no gradient this window (an unused parameter)
                self.views[index].zero_()
        rows = self._rows[segment]
        if self.scatter:
            return _InFlight(self.comm.reduce_scatter(rows[self.comm.rank], rows.view(-1)), None)
        return _InFlight(self.comm.all_reduce(rows), None)

    def zero(self) -> None:
        """Start a new accumulation window: the next gradients overwrite the buffer."""
        self._written = [False] * len(self.params)
        for param in self.params:
            param.grad = None


class PartitionedGrads:
    """Only this rank's shard of the gradients (stages 2 and 3), reduced every micro-batch.

    Args:
        layout: the flat layout of the parameters.
        buckets: runs of consecutive segments reduced together (``reduce_bucket_size``).
        order: the order buckets are launched in (the order backward completes them).
        scatter: reduce-scatter (``reduce_scatter``); otherwise all-reduce and keep one's part.
        contiguous: copy each gradient into a reusable bucket buffer the moment it is produced
            and free it (``contiguous_gradients``); otherwise keep autograd's gradients until
            their bucket is full, then pack them into a fresh buffer.
        overlap: let backward go on while a full bucket is reduced (``overlap_comm``);
            otherwise the hook of its last gradient waits for the reduction, so memory is
            still freed bucket by bucket.
    """

    def __init__(
        self,
        layout: FlatLayout,
        comm: Communicator,
        tracker: MemoryTracker,
        dtype: torch.dtype,
        device: torch.device,
        *,
        buckets: Sequence[range],
        order: Sequence[int],
        scatter: bool,
        contiguous: bool,
        overlap: bool,
    ) -> None:
        self.layout, self.comm, self.tracker = layout, comm, tracker
        self.scatter, self.contiguous, self.overlap = scatter, contiguous, overlap
        self.dtype, self.device = dtype, device
        self.shard = torch.zeros(layout.shard_numel, dtype=dtype, device=device)
        tracker.add("grads", tensor_bytes(self.shard))
        self.owned_grads = [shard_piece(self.shard, s) for s in layout.segments]
        self._buckets = list(buckets)
        self._bucket_of_segment = {s: b for b, run in enumerate(buckets) for s in run}
        self._bucket_chunk = [sum(layout.segments[s].chunk for s in run) for run in buckets]
        self._bucket_start = [layout.segments[run[0]].shard_offset for run in buckets]
        self._sizes = [sum(len(layout.segments[s].params) for s in run) for run in buckets]
        self._pending = list(self._sizes)
        self._staging: dict[int, torch.Tensor] = {}
        self._held: dict[int, list[tuple[int, torch.Tensor]]] = {}
        self._free: list[torch.Tensor] = []
        self._allocated = 0
        self._fresh = True  # the shard holds nothing of this accumulation window yet
        self._placed = [False] * len(layout.param_numels)  # gradient copied this micro-batch
        self._launcher = _OrderedLauncher(order, self._launch, synchronous=not overlap)

    @property
    def overlapped(self) -> int:
        """Reductions backward ran on past (0 without ``overlap_comm``)."""
        return self._launcher.overlapped

    @property
    def num_buckets(self) -> int:
        return len(self._buckets)

    def begin_backward(self, boundary: bool) -> None:
        self._pending = list(self._sizes)
        self._placed = [False] * len(self.layout.param_numels)

    def on_grad(self, index: int, param: torch.nn.Parameter) -> None:
        grad = param.grad
        assert grad is not None
        param.grad = None
        bucket = self._bucket_of_segment[self.layout.param_segment[index]]
        if self.contiguous:
            self._place(self._acquire(bucket), index, grad)
        else:
            self._held.setdefault(bucket, []).append((index, grad))
            self.tracker.add("grads", tensor_bytes(grad))
        self._pending[bucket] -= 1
        if self._pending[bucket] == 0:
            self._launcher.ready(bucket)

    def finish_backward(self) -> None:
        self._launcher.launch_all()
        self._launcher.drain()
        self._fresh = False

    def zero(self) -> None:
        self._fresh = True

    def _acquire(self, bucket: int) -> torch.Tensor:
        """The bucket's staging buffer; reuses a finished bucket's when it can."""
        staging = self._staging.get(bucket)
        if staging is not None:
            return staging
        if not self._free and self._allocated >= 2 and self._launcher.in_flight:
            # Two buffers, as DeepSpeed's: fill one while the other is being reduced.
            self._launcher.wait_oldest()
        if self._free:
            staging = self._free.pop()
        else:
            staging = torch.empty(
                max(self._bucket_chunk) * self.comm.world_size, dtype=self.dtype, device=self.device
            )
            self.tracker.add("buffers", tensor_bytes(staging))
            self._allocated += 1
        rows = staging[: self._bucket_chunk[bucket] * self.comm.world_size]
        rows = rows.view(self.comm.world_size, -1)
        # Not zeroed: every gradient is copied over its place; only padding and parameters
        # without a gradient are zeroed when the bucket is sent (_fill_gaps).
        self._staging[bucket] = rows
        return rows

    def _pieces(self, segment_index: int, start: int, numel: int) -> list[tuple[int, int, int]]:
        """``(row, column, length)`` runs of a segment's ``[start, start + numel)`` in a bucket's
        ``[world, chunk]`` rows (a run stops where a rank's chunk does)."""
        segment = self.layout.segments[segment_index]
        column_base = (
            segment.shard_offset - self._bucket_start[self._bucket_of_segment[segment_index]]
        )
        pieces, done = [], 0
        while done < numel:
            row, column = divmod(start + done, segment.chunk)
            take = min(numel - done, segment.chunk - column)
            pieces.append((row, column_base + column, take))
            done += take
        return pieces

    def _place(self, rows: torch.Tensor, index: int, grad: torch.Tensor) -> None:
        """Copy a parameter's gradient to its place in the bucket's ``[world, chunk]`` rows."""
        layout = self.layout
        flat = grad.reshape(-1)
        done = 0
        for row, column, take in self._pieces(
            layout.param_segment[index], layout.offset_in_segment(index), flat.numel()
        ):
            rows[row, column : column + take].copy_(flat[done : done + take])
            done += take
        self._placed[index] = True

    def _fill_gaps(self, bucket: int, rows: torch.Tensor) -> None:
        """Zero what no gradient was copied over: padding, and parameters without a gradient."""
        layout = self.layout
        for segment_index in self._buckets[bucket]:
            segment = layout.segments[segment_index]
            gaps = [
                (layout.offset_in_segment(i), layout.param_numels[i])
                for i in segment.params
                if not self._placed[i]
            ]
            used = layout.param_offsets[segment.end_param - 1] - segment.offset
            used += layout.param_numels[segment.end_param - 1]
            gaps.append((used, segment.numel - used))
            for start, numel in gaps:
                for row, column, take in self._pieces(segment_index, start, numel):
                    rows[row, column : column + take].zero_()

    def _launch(self, bucket: int) -> _InFlight:
        if self.contiguous:
            rows = self._acquire(bucket)
        else:
            rows = torch.empty(
                self.comm.world_size,
                self._bucket_chunk[bucket],
                dtype=self.dtype,
                device=self.device,
            )
            self.tracker.add("buffers", tensor_bytes(rows))
            for index, grad in self._held.pop(bucket, []):
                self._place(rows, index, grad)
                self.tracker.add("grads", -tensor_bytes(grad))
        self._fill_gaps(bucket, rows)
        start = self._bucket_start[bucket]
        out = self.shard[start : start + self._bucket_chunk[bucket]]
        fresh = self._fresh
        if self.scatter:
            handle = self.comm.reduce_scatter(out, rows.view(-1), accumulate=not fresh)
        else:
            handle = self.comm.all_reduce(rows)

        def after() -> None:
            if not self.scatter:
                if fresh:
                    out.copy_(rows[self.comm.rank])
                else:
                    out.add_(rows[self.comm.rank])
            self._release(bucket, rows)

        return _InFlight(handle, after)

    def _release(self, bucket: int, rows: torch.Tensor) -> None:
        if self.contiguous:
            del self._staging[bucket]
            self._free.append(_base_of(rows))
        else:
            self.tracker.add("buffers", -tensor_bytes(rows))


def _base_of(view: torch.Tensor) -> torch.Tensor:
    base = view._base
    return base if base is not None else view
