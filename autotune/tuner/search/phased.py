"""``gridsearch`` and ``random``: DeepSpeed's autotuner's flow, with its bugs fixed, one phase
after another.

1. ``max_micro_batch``: per ZeRO variant, find the largest micro-batch that fits, exactly
   (:mod:`autotune.tuner.probe`). Variants are searched one after another, in an order the
   tuner type decides (:func:`~autotune.tuner.prior.variant_order`).
2. ``micro_batch``: compare the largest fit and sizes about half apart below it
   (``num_tuning_micro_batch_sizes`` in all), per variant, in the tuner type's point order.
   ``fast: true`` (and no knob lists) stops the search here.
3. ``knobs``: each surviving variant at its best micro-batch, over its knobs.

A sampled phase (2 and 3) ends early after ``tuner_early_stopping`` experiments without a new
best; the next phase then begins.
"""

from __future__ import annotations

from collections.abc import Container, Iterable

from autotune.config.knobs import MICRO_BATCH_KEY
from autotune.experiment import ExperimentResult
from autotune.tuner.candidate import Phase
from autotune.tuner.phase_search import PhaseSearch
from autotune.tuner.point_order import Point, Subspace
from autotune.tuner.prior import best_micro_batch
from autotune.tuner.search.base import Search, SearchContext, note_unsearched_variants


class PhasedSearch(Search):
    """The baselines' search (see the module docstring); the point order is the tuner
    type's (``autotuning.tuner_type``: ``gridsearch`` or ``random``)."""

    phases = (Phase.max_micro_batch, Phase.micro_batch, Phase.knobs)

    def __init__(self, context: SearchContext) -> None:
        super().__init__(context)
        self._sampled: PhaseSearch | None = None  # the sampled phase's, while one runs

    def begin(self, phase: Phase) -> None:
        self._sampled = None
        if phase is Phase.micro_batch:
            note_unsearched_variants(self.context)
            self._sample(phase, *self._micro_batch_subspaces())
        elif phase is Phase.knobs:
            self._sample(phase, *self._knob_subspaces())

    def next(self, phase: Phase) -> str | None:
        context = self.context
        if phase is Phase.max_micro_batch:
            return context.sizes.next_owed() or context.sizes.next()
        sampled = self._sampled
        if sampled is None:  # nothing to tune in this phase
            return None
        # What an interrupted run had running comes first, as it would have finished first.
        owed = (n for n in context.ledger.owed() if n in sampled)
        if (name := next(owed, None)) is not None:
            return name
        if context.stopping.patience_spent(phase, sampled.points):
            return None  # until a result in flight brings a new best, if one does
        return sampled.ask(context.catalog.is_open)

    def patience(self, phase: Phase) -> Container[str] | None:
        return self._sampled.points if self._sampled is not None else None

    def points(self, phase: Phase) -> Iterable[str]:
        return self._sampled.points if self._sampled is not None else ()

    def tell(self, result: ExperimentResult) -> None:
        if self._sampled is not None:
            self._sampled.tell(result)

    def drop(self, name: str) -> None:
        if self._sampled is not None:
            self._sampled.drop(name)

    def end(self, phase: Phase) -> None:
        self._sampled = None

    def _micro_batch_subspaces(self) -> tuple[list[Subspace], dict[Point, str]]:
        context = self.context
        subspaces, names = [], {}
        for plan in context.catalog.space.plans:
            largest = context.ledger.largest_fit(plan.variant)
            if largest is None:
                continue
            # Largest first: the grid tries large micro-batches (usually fastest) first.
            subspace = Subspace(
                plan.variant.label, ((MICRO_BATCH_KEY, plan.compared_sizes(largest)),)
            )
            subspaces.append(subspace)
            for point in subspace.points():
                size = point.as_dict()[MICRO_BATCH_KEY]
                names[point] = context.catalog.register(plan.variant, size, ())
        return subspaces, names

    def _knob_subspaces(self) -> tuple[list[Subspace], dict[Point, str]]:
        context = self.context
        subspaces, names = [], {}
        for plan in context.catalog.space.plans:
            size = best_micro_batch(plan, context.ledger, context.config.autotuning)
            if size is None or not plan.knobs:
                continue
            subspace = Subspace(plan.variant.label, plan.knobs)
            subspaces.append(subspace)
            for point in subspace.points():
                names[point] = context.catalog.register(plan.variant, size, point.values)
        return subspaces, names

    def _sample(self, phase: Phase, subspaces: list[Subspace], names: dict[Point, str]) -> None:
        if not subspaces:
            return
        self.context.stopping.phase_begins()  # each search phase ends for its own reason
        tuning = self.context.config.autotuning
        self._sampled = PhaseSearch(phase, subspaces, names, tuning, self.context.ledger)
