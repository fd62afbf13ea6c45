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

from autotune.config import TunerType
from autotune.config.knobs import MICRO_BATCH_KEY
from autotune.tuner.candidate import Decision, DecisionKind, Phase
from autotune.tuner.phase_search import PhaseSearch
from autotune.tuner.point_order import Point, Subspace
from autotune.tuner.prior import best_micro_batch
from autotune.tuner.search.base import Search, SearchContext


class PhasedSearch(Search):
    """The baselines' search (see the module docstring), in ``tuner_type``'s point order
    (``gridsearch`` or ``random``)."""

    phases = (Phase.max_micro_batch, Phase.micro_batch, Phase.knobs)

    def __init__(self, tuner_type: TunerType) -> None:
        self.tuner_type = tuner_type

    def decide(self, context: SearchContext) -> Decision:
        trace = context.trace
        for phase in self.phases:
            sampled = self._begin(phase, context)
            points = tuple(sampled.points) if sampled is not None else ()
            name = self._next(phase, context, sampled)
            if name is not None or _in_flight(phase, context):
                trace.current = (phase, points)
                if name is None:
                    return Decision(DecisionKind.wait, phase)
                return Decision.propose(context.history.entries[name], name, phase)
            patience = sampled.points if sampled is not None else None
            trace.end(phase, points, context.stopping.phase_end(phase, patience))
        if context.history.pending:  # a result in flight may still bring a new best
            return Decision(DecisionKind.wait, self.phases[-1])
        return Decision(DecisionKind.end, self.phases[-1], stop=trace.stopped())

    def _begin(self, phase: Phase, context: SearchContext) -> PhaseSearch | None:
        """The sampled phase's search (None for the micro-batch search, or a phase with
        nothing to tune)."""
        if phase is Phase.micro_batch:
            context.note_unsearched_variants()
            subspaces, names = _micro_batch_subspaces(context)
        elif phase is Phase.knobs:
            subspaces, names = _knob_subspaces(context)
        else:
            return None
        if not subspaces:
            return None
        context.trace.begin()  # each search phase ends for its own reason
        return PhaseSearch(phase, subspaces, names, context.tuning, context.history)

    @staticmethod
    def _next(phase: Phase, context: SearchContext, sampled: PhaseSearch | None) -> str | None:
        if phase is Phase.max_micro_batch:
            return context.sizes.next()
        if sampled is None:  # nothing to tune in this phase
            return None
        if context.stopping.patience_spent(phase, sampled.points):
            return None  # until a result in flight brings a new best, if one does
        return sampled.ask(context.catalog.is_open)


def _in_flight(phase: Phase, context: SearchContext) -> bool:
    """Whether an experiment of ``phase`` is in flight (one whose phase the trial does not
    record counts too): the phase is not over until it is in. One of a later phase does not
    hold it (the next phase's sizes run beside the last of this one's, as slots free up)."""
    return any(e.phase in (phase.value, None) for e in context.history.pending.values())


def _micro_batch_subspaces(context: SearchContext) -> tuple[list[Subspace], dict[Point, str]]:
    subspaces, names = [], {}
    for plan in context.space.plans:
        largest = context.history.largest_fit(plan.variant)
        if largest is None:
            continue
        # Largest first: the grid tries large micro-batches (usually fastest) first.
        subspace = Subspace(plan.variant.label, ((MICRO_BATCH_KEY, plan.compared_sizes(largest)),))
        subspaces.append(subspace)
        for point in subspace.points():
            size = point.as_dict()[MICRO_BATCH_KEY]
            names[point] = context.catalog.register(plan.variant, size, ())
    return subspaces, names


def _knob_subspaces(context: SearchContext) -> tuple[list[Subspace], dict[Point, str]]:
    subspaces, names = [], {}
    for plan in context.space.plans:
        size = best_micro_batch(plan, context.history, context.tuning)
        if size is None or not plan.knobs:
            continue
        subspace = Subspace(plan.variant.label, plan.knobs)
        subspaces.append(subspace)
        for point in subspace.points():
            names[point] = context.catalog.register(plan.variant, size, point.values)
    return subspaces, names
