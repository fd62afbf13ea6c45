"""Any Optuna sampler the user passes (``autotune.api.tune(sampler=...)``) as the search, in one
phase (``sampler``) over the whole space.

The study's sampler is the user's: each proposal is a trial asked of the study, its
parameters suggested define-by-run (:meth:`~autotune.tuner.search_space.SearchSpace.suggest`),
so that samplers that model conditional spaces (TPE, GP) see what each stage searches. A
suggestion that is no configuration the space may still run (already measured, pruned by an
``oom`` below it, a micro-batch the batch limits rule out) is told ``FAIL`` with the reason as
its ``not_run`` attribute, unrun, and the sampler asked again; after :data:`MAX_REJECTED` such
suggestions in a row the search ends. Early stopping, the trial cap and the time budget bound
it as they bound the others; re-measurement follows it as it follows them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from autotune.config import TunerType
from autotune.tuner.candidate import Decision, DecisionKind, Phase
from autotune.tuner.search.base import Search, SearchContext
from autotune.tuner.search_space import NotRunnable

if TYPE_CHECKING:
    import optuna

    from autotune.tuner.history import Entry
    from autotune.tuner.search_space import SearchSpace

# Suggestions in a row that are no configuration to run before the search gives up: the
# sampler keeps proposing what was measured (a small space, exhausted).
MAX_REJECTED = 32


class SamplerSearch(Search):
    """The user's Optuna sampler as the search (see the module docstring)."""

    phases = (Phase.sampler,)
    tuner_type = TunerType.random  # the variants' order of the memory search it never runs

    def decide(self, context: SearchContext) -> Decision:
        """Ask the study's sampler (``DecisionKind.ask``), unless early stopping ended it."""
        history = context.history
        proposed = {e.name for e in history if e.repeat_of is None}
        if not context.stopping.patience_spent(Phase.sampler, proposed):
            return Decision(DecisionKind.ask, Phase.sampler)
        if history.pending:
            return Decision(DecisionKind.wait, Phase.sampler)
        context.trace.end(Phase.sampler, (), context.stopping.phase_end(Phase.sampler, proposed))
        context.note_unsearched_variants()
        return Decision(DecisionKind.end, Phase.sampler, stop=context.trace.stopped())

    @staticmethod
    def refusal(context: SearchContext, params: Mapping[str, Any]) -> str | None:
        """Why the configuration a sampler suggested (``params``) may not run: measured, in
        flight, pruned, breaking a rule; None: it may."""
        entry = context.search.entry(params)
        name = context.catalog.register(entry.variant, entry.micro_batch_size, entry.knobs)
        if not context.catalog.is_open(name):
            return f"{name} was measured or is pruned"
        return None

    @staticmethod
    def exhausted(context: SearchContext) -> Decision:
        """The sampler suggested nothing to run :data:`MAX_REJECTED` times in a row."""
        context.trace.end(Phase.sampler, (), None)
        context.note_unsearched_variants()
        return Decision(DecisionKind.end, Phase.sampler, stop=context.trace.stopped())


def ask_sampler(
    study: optuna.Study, space: SearchSpace, context: SearchContext
) -> tuple[optuna.Trial, Entry] | None:
    """Ask the study's sampler (the user's) for a configuration the space may run: each
    suggestion that is none is told ``FAIL`` unrun, with why; None after
    :data:`MAX_REJECTED` of them in a row."""
    from autotune.tuner.record import refuse

    for _ in range(MAX_REJECTED):
        trial = study.ask()
        try:
            params = space.suggest(trial)
            why = SamplerSearch.refusal(context, params)
        except NotRunnable as err:
            why = str(err)
        if why is None:
            return trial, space.entry(params)
        refuse(study, trial, why)
    return None
