"""Flat-buffer layout: where each parameter lives, and which slice of it each rank owns.

Parameters are packed one after another into *segments*. A segment is padded to a multiple of
the world size and split into ``world_size`` equal chunks; rank ``r`` owns chunk ``r`` of every
segment. A rank's *shard* is its chunks of all segments laid end to end.

Why segments rather than one big partition: a segment is the unit a collective works on. Its
gradients can be reduce-scattered as soon as the segment's last gradient is ready, and its
parameters all-gathered straight into place, because every segment is contiguous in the full
buffer and its chunks are contiguous in the shard. Stages 0-2 make one segment per reduce
bucket; stage 3 makes one per module.

This module is pure arithmetic: no torch.distributed, testable without a process group.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Segment:
    """A run of whole parameters, padded to a multiple of the world size."""

    first_param: int
    end_param: int
    offset: int  # where it starts in the full flat buffer
    numel: int  # padded length
    shard_offset: int  # where its chunk starts in each rank's shard
    chunk: int  # numel // world_size: the part each rank owns

    @property
    def params(self) -> range:
        return range(self.first_param, self.end_param)


@dataclass(frozen=True)
class FlatLayout:
    """Offsets of parameters and segments in the full buffer and in a rank's shard."""

    world_size: int
    param_numels: tuple[int, ...]
    param_offsets: tuple[int, ...]
    param_segment: tuple[int, ...]
    segments: tuple[Segment, ...]

    @classmethod
    def build(
        cls, param_numels: Sequence[int], segment_sizes: Sequence[int], world_size: int
    ) -> FlatLayout:
        """Lay out parameters in order, ``segment_sizes[i]`` consecutive ones per segment."""
        assert sum(segment_sizes) == len(param_numels), "every parameter in exactly one segment"
        offsets: list[int] = []
        owner: list[int] = []
        segments: list[Segment] = []
        flat = shard = first = 0
        for index, count in enumerate(segment_sizes):
            start = flat
            for numel in param_numels[first : first + count]:
                offsets.append(flat)
                owner.append(index)
                flat += numel
            padded = _round_up(max(flat - start, 1), world_size)
            chunk = padded // world_size
            segments.append(Segment(first, first + count, start, padded, shard, chunk))
            flat, shard, first = start + padded, shard + chunk, first + count
        return cls(world_size, tuple(param_numels), tuple(offsets), tuple(owner), tuple(segments))

    @property
    def numel(self) -> int:
        """Length of the full flat buffer, padding included."""
        last = self.segments[-1]
        return last.offset + last.numel

    @property
    def shard_numel(self) -> int:
        """Length of one rank's shard."""
        return self.numel // self.world_size

    def offset_in_segment(self, param: int) -> int:
        return self.param_offsets[param] - self.segments[self.param_segment[param]].offset

    def params_in(self, segment: int, start: int, stop: int) -> list[tuple[int, int, int]]:
        """``(param, begin, end)`` of the parameters in ``[start, stop)`` of a segment.

        Offsets are relative to ``start``; padding belongs to no parameter and is left out.

        Example:
            >>> layout = FlatLayout.build([3, 2], [2], world_size=2)  # one segment, 6 long
            >>> layout.params_in(0, 3, 6)  # rank 1's chunk: parameter 1, then padding
            [(1, 0, 2)]
        """
        seg = self.segments[segment]
        ranges = []
        for param in seg.params:
            begin = self.param_offsets[param] - seg.offset
            end = begin + self.param_numels[param]
            if begin < stop and end > start:
                ranges.append((param, max(begin, start) - start, min(end, stop) - start))
        return ranges

    def gather_chunks(self, max_numel: int) -> list[list[tuple[int, int, int]]]:
        """Split the shard into all-gather rounds of at most ``max_numel`` gathered elements.

        Each round is a list of ``(segment, start, stop)``: columns of that segment's chunk, so
        a round gathers ``world_size * sum(stop - start)`` elements. Rounds never exceed the
        limit except when one column would (a round holds at least one element per rank).
        """
        per_rank = max(max_numel // self.world_size, 1)
        rounds: list[list[tuple[int, int, int]]] = []
        current: list[tuple[int, int, int]] = []
        room = per_rank
        for index, segment in enumerate(self.segments):
            start = 0
            while start < segment.chunk:
                stop = min(segment.chunk, start + room)
                current.append((index, start, stop))
                room -= stop - start
                start = stop
                if room == 0:
                    rounds.append(current)
                    current, room = [], per_rank
        if current:
            rounds.append(current)
        return rounds


def group_by_numel(numels: Sequence[int], max_numel: int) -> list[int]:
    """Sizes of runs of consecutive items whose numel adds up to at most ``max_numel``.

    An item larger than the limit gets a run of its own.
    """
    sizes: list[int] = []
    count = total = 0
    for numel in numels:
        if count and total + numel > max_numel:
            sizes.append(count)
            count = total = 0
        count += 1
        total += numel
    if count:
        sizes.append(count)
    return sizes


def param_views(
    flat: torch.Tensor, layout: FlatLayout, shapes: Sequence[torch.Size]
) -> list[torch.Tensor]:
    """Each parameter's view into a full flat buffer."""
    return [
        flat[offset : offset + numel].view(shape)
        for offset, numel, shape in zip(
            layout.param_offsets, layout.param_numels, shapes, strict=True
        )
    ]


def segment_rows(flat: torch.Tensor, segment: Segment, world_size: int) -> torch.Tensor:
    """A segment of a full flat buffer as ``[world_size, chunk]``: row ``r`` is rank ``r``'s."""
    return flat[segment.offset : segment.offset + segment.numel].view(world_size, segment.chunk)


def shard_piece(shard: torch.Tensor, segment: Segment) -> torch.Tensor:
    """A segment's chunk inside a rank's shard buffer."""
    return shard[segment.shard_offset : segment.shard_offset + segment.chunk]


def _round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple
