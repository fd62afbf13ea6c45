"""What every search shares: what it reads (:class:`SearchContext`, built from the study for
one decision), what it answers (:class:`Decision`), and what it saw on the way
(:class:`Trace`, for the summary's "not run").

A search is a walk over its phases from the first, on what the study holds: a phase that
has nothing more to propose and nothing in flight has ended (early stopping, the cost
model's word, or all it had), and the walk goes on to the next; the first phase with
something to propose proposes it, one whose next proposal needs a result in flight waits.
Nothing is kept between decisions but caches of what was computed from the same trials, so
the walk of a resumed run, or of another process on the same storage, decides alike.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from autotune.config import AutotuningConfig, TunerType
from autotune.tuner.bounds import Bounds
from autotune.tuner.candidate import Decision, Phase
from autotune.tuner.catalog import Catalog
from autotune.tuner.history import History
from autotune.tuner.probe import SizeSearch
from autotune.tuner.reasons import NotRunKind, NotRunReason, StopKind, StopReason
from autotune.tuner.stopping import Stopping

if TYPE_CHECKING:
    from collections.abc import Iterable

    from autotune.profiling.model_info import ModelInfo
    from autotune.tuner.search_space import SearchSpace
    from autotune.tuner.space import TuningSpace


@dataclass
class Trace:
    """What a walk saw: each phase that ended, with the configurations it considered and
    why it ended (None: it ran all it had), where it stopped, and why variants have nothing
    that ran ok."""

    ended: list[tuple[Phase, tuple[str, ...], StopReason | None]] = field(default_factory=list)
    current: tuple[Phase, tuple[str, ...]] | None = None
    variants: dict[str, NotRunReason] = field(default_factory=dict)
    reason: StopReason | None = None

    def begin(self) -> None:
        """A phase with something to do begins: it ends for its own reason."""
        self.reason = None

    def end(self, phase: Phase, points: Iterable[str], reason: StopReason | None) -> None:
        self.ended.append((phase, tuple(points), reason))
        if reason is not None:
            self.reason = reason

    def stopped(self) -> StopReason:
        """Why the search ended: the last limit a phase reached, else it ran all it had."""
        return self.reason or StopReason(StopKind.exhausted)


@dataclass
class SearchContext:
    """What one decision reads, built from the study (:meth:`build`).

    Attributes:
        search: the search space.
        history: what the study says of the run.
        space: the variants searched now (with the model's size where it is known).
        tuning: the ``autotuning`` section, with the sampler's tuner type and seed.
        model_info: the model's sizes (None: not known yet).
        catalog: the configurations by name.
        bounds: what failures prune.
        stopping: the rules that end a phase.
        sizes: the search for each variant's largest micro-batch.
        trace: what the walk saw.
    """

    search: SearchSpace
    history: History
    space: TuningSpace
    tuning: AutotuningConfig
    model_info: ModelInfo | None
    catalog: Catalog
    bounds: Bounds
    stopping: Stopping
    sizes: SizeSearch
    trace: Trace

    @classmethod
    def build(
        cls, search: SearchSpace, history: History, tuner_type: TunerType, seed: int
    ) -> SearchContext:
        tuning = search.config.autotuning.model_copy(
            update={"tuner_type": tuner_type, "seed": seed}
        )
        model_info = search.model(history)
        space = search.plan(history)
        bounds = Bounds(history)
        catalog = Catalog(history, bounds, space, search)
        trace = Trace()
        for label, why in space.pruned.items():
            trace.variants[label] = NotRunReason(NotRunKind.variant_rule, (why,))
        return cls(
            search,
            history,
            space,
            tuning,
            model_info,
            catalog,
            bounds,
            Stopping(history, tuning, bounds),
            SizeSearch(catalog, history, bounds, tuning, model_info),
            trace,
        )

    def note_unsearched_variants(self) -> None:
        """Why each variant with nothing that ran ok has none: never run is not the same as
        nothing fits (the search can end before it)."""
        history, metric = self.history, self.tuning.metric
        ran = {entry.variant for name, entry in history.entries.items() if name in history.results}
        for plan in self.space.plans:
            if history.best_score(plan.variant, metric) is not None:
                continue
            kind = NotRunKind.none_fit if plan.variant in ran else NotRunKind.not_searched
            self.trace.variants.setdefault(plan.variant.label, NotRunReason(kind))


class Search:
    """A tuner type's search: its phases, walked on one decision's context."""

    phases: tuple[Phase, ...] = ()
    tuner_type: TunerType

    def decide(self, context: SearchContext) -> Decision:
        """What to measure next, or wait, or why the search is over."""
        raise NotImplementedError

    def not_measured(self, context: SearchContext) -> dict[str, int]:
        """Once the search is over: per variant, the configurations it left unmeasured for
        its own reason, beyond those its phases considered (``model_based``'s)."""
        return {}
