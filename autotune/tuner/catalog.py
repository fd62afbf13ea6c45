"""Every configuration the tuner may propose, by name: how a variant, micro-batch and knob
values become a name and an entry in the ledger, and whether a name may still run."""

from __future__ import annotations

from typing import Any

from autotune.tuner.bounds import Bounds
from autotune.tuner.ledger import Entry, Ledger
from autotune.tuner.point_order import Point
from autotune.tuner.reasons import NotRunKind, NotRunReason
from autotune.tuner.space import TuningSpace, Variant, VariantPlan, recommended_point


class Catalog:
    """The names of the configurations in ``space`` (the one searched now, see
    :meth:`use_space`), registered in ``ledger`` as they are first proposed or told.

    Attributes:
        space: the space searched now.
        size_names: the name of every micro-batch run at the config's own knobs, of any
            variant of any space searched (with or without the model's size), → its variant
            and size: a result told from history is known by it.
    """

    def __init__(self, ledger: Ledger, bounds: Bounds, space: TuningSpace) -> None:
        self._ledger = ledger
        self._bounds = bounds
        self.space = space
        self.size_names: dict[str, tuple[Variant, int]] = {}
        self.use_space(space)

    def use_space(self, space: TuningSpace) -> None:
        """Search ``space`` from now on; what it prunes stays pruned."""
        self.space = space
        for label, why in space.pruned.items():
            self._ledger.rule_out_variant(label, NotRunReason(NotRunKind.variant_rule, (why,)))
        self.add_size_names(space)

    def add_size_names(self, space: TuningSpace) -> None:
        """Know the micro-batch runs of ``space`` by name (named as the space searched now
        names them); the sizes the user listed are registered, each accounted for."""
        for plan in space.plans:
            for size in plan.ladder:
                self.size_names.setdefault(
                    self.name_of(plan.variant, size, ()), (plan.variant, size)
                )
                if not plan.halving:
                    self.register(plan.variant, size, ())

    def register(self, variant: Variant, size: int, knobs: tuple[tuple[str, Any], ...]) -> str:
        """The name of ``variant`` at micro-batch ``size`` with ``knobs``, in the ledger."""
        name = self.name_of(variant, size, knobs)
        if name not in self._ledger.entries:
            overrides = self.space.overrides(variant, size, dict(knobs))
            self._ledger.register(name, Entry(variant, size, knobs, overrides))
            self._bounds.note(name)
        return name

    def register_size_run(self, name: str) -> bool:
        """Register ``name`` if it names a micro-batch run of a space searched (one told from
        history, or owed, may be of a space searched before the model's size was known);
        whether the ledger knows it now."""
        if name not in self._ledger.entries and name in self.size_names:
            self.register(*self.size_names[name], ())
        return name in self._ledger.entries

    def recommended(self, plan: VariantPlan) -> Point | None:
        """The knob point practice recommends for ``plan`` (see :func:`recommended_point`)."""
        values = recommended_point(plan.knobs, self.space.base)
        return None if values is None else Point(plan.variant.label, values)

    def is_open(self, name: str) -> bool:
        """Free, and nothing prunes it."""
        return (
            self._ledger.may_propose(name)
            and not self._bounds.oom_pruner(name)
            and not self._bounds.data_pruner(name)
        )

    def name_of(self, variant: Variant, size: int, knobs: tuple[tuple[str, Any], ...]) -> str:
        """The name of ``variant`` at micro-batch ``size`` with ``knobs``, not registered."""
        return self.space.name(self.space.overrides(variant, size, dict(knobs)))
