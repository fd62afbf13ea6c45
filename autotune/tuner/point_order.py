"""Point orders: which point of a finite space a sampled phase tries next (gridsearch's and
random's micro-batch and knob phases). One ask/tell interface, two orders.

A space is a union of :class:`Subspace` s, each the product of a few value lists under a label
(one per ZeRO variant: its knobs differ). An order proposes an open point — one not run, not
pruned and not in flight, as the caller's ``is_open`` says — and learns from what it is told.
It can be told about points it never proposed: that is how a resumed run replays its history.

- :class:`GridOrder`: every point once, in a fixed order.
- :class:`RandomOrder`: every point once, in a seeded random order.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from autotune.config import TunerType

IsOpen = Callable[["Point"], bool]


@dataclass(frozen=True)
class Point:
    """One point: a subspace label and a value for each of its dimensions."""

    label: str
    values: tuple[tuple[str, Any], ...] = ()

    def as_dict(self) -> dict[str, Any]:
        return dict(self.values)


@dataclass(frozen=True)
class Subspace:
    """The product of value lists under one label.

    Example:
        >>> sub = Subspace("z1", (("a", (1, 2)), ("b", (True,))))
        >>> [p.as_dict() for p in sub.points()]
        [{'a': 1, 'b': True}, {'a': 2, 'b': True}]
    """

    label: str
    dims: tuple[tuple[str, tuple[Any, ...]], ...] = ()

    def points(self) -> list[Point]:
        keys = [key for key, _ in self.dims]
        products = itertools.product(*(values for _, values in self.dims))
        return [Point(self.label, tuple(zip(keys, combo, strict=True))) for combo in products]


class PointOrder(Protocol):
    """What every order does.

    Example:
        >>> order = GridOrder([Subspace("z0", (("mbs", (8, 4)),))])
        >>> point = order.ask(lambda p: True)
        >>> point.as_dict()
        {'mbs': 8}
        >>> order.tell(point, score=12.5)
    """

    def ask(self, is_open: IsOpen) -> Point | None:
        """An open point to try next, or None when none is left."""
        ...

    def tell(self, point: Point, score: float | None, infeasible: bool = False) -> None:
        """The outcome of ``point``: a score (higher is better), or None if it failed;
        ``infeasible`` when it ran out of memory."""
        ...


class GridOrder:
    """Every point once, subspace by subspace, each in the order of its value lists."""

    def __init__(self, space: Sequence[Subspace]) -> None:
        self._order = [point for subspace in space for point in subspace.points()]

    def ask(self, is_open: IsOpen) -> Point | None:
        return next((p for p in self._order if is_open(p)), None)

    def tell(self, point: Point, score: float | None, infeasible: bool = False) -> None:
        """The order does not depend on outcomes."""

    def count_open(self, is_open: IsOpen) -> int:
        return sum(1 for p in self._order if is_open(p))


class RandomOrder(GridOrder):
    """Every point once, in an order fixed by the seed (so a resumed run continues it)."""

    def __init__(self, space: Sequence[Subspace], seed: int = 0) -> None:
        super().__init__(space)
        random.Random(seed).shuffle(self._order)


def make_order(kind: TunerType | str, space: Sequence[Subspace], seed: int = 0) -> PointOrder:
    """The point order of ``autotuning.tuner_type``'s sampled phases.

    Example:
        >>> space = [Subspace("z0", (("mbs", (1, 2, 4)),))]
        >>> type(make_order("random", space, seed=3)).__name__
        'RandomOrder'
    """
    kind = TunerType(kind)
    if kind is TunerType.gridsearch:
        return GridOrder(space)
    if kind is TunerType.random:
        return RandomOrder(space, seed)
    raise ValueError(f"{kind.value} searches with its cost model, not a point order")
