"""Every configuration a search may propose, by name: how a variant, micro-batch and knob
values become a name and an entry in the history (a cache within one decision), and whether
a name may still run."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from autotune.config import ConfigError
from autotune.tuner.bounds import Bounds
from autotune.tuner.history import Entry, History
from autotune.tuner.knob_grid import recommended_point
from autotune.tuner.point_order import Point
from autotune.tuner.space import TuningSpace, Variant, VariantPlan

if TYPE_CHECKING:
    from autotune.tuner.search_space import SearchSpace


class Catalog:
    """The names of the configurations of ``space`` (the variants searched now, with the
    model's size where it is known), registered in ``history`` as a search considers them.

    Args:
        history: what the study says of the run.
        bounds: what failures prune.
        space: the variants searched now (``search.plan(history)``).
        search: the search space (names, overrides, configs).
    """

    def __init__(
        self, history: History, bounds: Bounds, space: TuningSpace, search: SearchSpace
    ) -> None:
        self._history = history
        self._bounds = bounds
        self.space = space
        self.search = search
        self._rejected: dict[str, str] = {}  # name → the config rule it breaks
        for plan in space.plans:  # the sizes the user listed, each accounted for
            if not plan.halving:
                for size in plan.ladder:
                    self.register(plan.variant, size, ())

    def register(self, variant: Variant, size: int, knobs: tuple[tuple[str, Any], ...]) -> str:
        """The name of ``variant`` at micro-batch ``size`` with ``knobs``, in the history."""
        entry = self.search.entry_at(variant, size, knobs)
        name = self.search.name_of(entry)
        self._history.register(name, entry)
        return name

    def recommended(self, plan: VariantPlan) -> Point | None:
        """The knob point practice recommends for ``plan`` (see :func:`recommended_point`)."""
        values = recommended_point(plan.knobs, self.space.base)
        return None if values is None else Point(plan.variant.label, values)

    def is_open(self, name: str) -> bool:
        """Free, valid, and nothing prunes it."""
        return (
            self._history.is_free(name)
            and self.breaks_rule(name) is None
            and not self._bounds.oom_pruner(name)
            and not self._bounds.data_pruner(name)
        )

    def breaks_rule(self, name: str) -> str | None:
        """The config rule configuration ``name`` breaks (None: none; a name not registered
        breaks none that is known)."""
        if name not in self._rejected:
            entry = self._history.entries.get(name)
            if entry is None:
                return None
            try:
                self.search.config_of(entry)
                self._rejected[name] = ""
            except ConfigError as err:
                self._rejected[name] = str(err)
        return self._rejected[name] or None

    @property
    def rejected(self) -> dict[str, str]:
        """The configurations considered that break a config rule, with the rule."""
        return {name: why for name, why in self._rejected.items() if why}

    def entry(self, name: str) -> Entry:
        return self._history.entries[name]
