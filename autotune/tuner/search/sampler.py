"""Any Optuna sampler the user passes (``autotune.api.tune(sampler=...)``) as the search, in one
phase (``sampler``) over the whole space.

The study's sampler is the user's: each proposal is a trial asked of the study, its
parameters suggested define-by-run (``zero_stage`` and ``micro_batch_size``, then the
variant's choices where the stage has several, then the knobs tuned there), so that samplers
that model conditional spaces (TPE, GP) see what each stage searches. A suggestion that is no
configuration the space may still run (already measured, pruned by an ``oom`` below it, a
micro-batch the batch limits rule out) is told ``FAIL`` with the reason as its ``not_run``
attribute, unrun, and the sampler asked again; after :data:`MAX_REJECTED` such suggestions in
a row the search ends. The trial cap, early stopping and the time budget bound it as they
bound the others; re-measurement follows it as it follows them.
"""

from __future__ import annotations

from collections.abc import Container
from typing import TYPE_CHECKING, Any

from autotune.tuner.candidate import Phase
from autotune.tuner.search.base import Search, SearchContext
from autotune.tuner.space import Variant
from autotune.tuner.trials import (
    CHECKPOINTING_PARAM,
    MICRO_BATCH_PARAM,
    NOT_RUN_ATTR,
    OFFLOAD_PARAM,
    STAGE_PARAM,
)

if TYPE_CHECKING:
    import optuna

# Suggestions in a row that are no configuration to run before the search gives up: the
# sampler keeps proposing what was measured (a small space, exhausted).
MAX_REJECTED = 32


class SamplerSearch(Search):
    """The user's Optuna sampler as the search (see the module docstring)."""

    phases = (Phase.sampler,)

    def __init__(self, context: SearchContext, study: optuna.Study) -> None:
        super().__init__(context)
        self._study = study
        self._proposed: set[str] = set()
        self._asked: dict[str, optuna.Trial] = {}
        self._knob_choices: dict[str, tuple[Any, ...]] = {}  # kept as first seen

    def next(self, phase: Phase) -> str | None:
        context = self.context
        for owed in context.ledger.owed():  # an interrupted run's, first
            if owed in context.ledger.entries:
                return owed
        if context.stopping.patience_spent(phase, self._proposed):
            return None
        for _ in range(MAX_REJECTED):
            trial = self._study.ask()
            name, why = self._configuration(trial)
            if name is not None:
                self._asked[name] = trial
                self._proposed.add(name)
                return name
            trial.set_user_attr(NOT_RUN_ATTR, why)
            self._study.tell(trial, state=_fail())
        return None

    def asked(self, name: str) -> optuna.Trial | None:
        """The trial the sampler was asked for ``name`` (None: it was not)."""
        return self._asked.pop(name, None)

    def patience(self, phase: Phase) -> Container[str] | None:
        return self._proposed

    def _configuration(self, trial: optuna.Trial) -> tuple[str | None, str]:
        """The configuration the sampler suggests in ``trial``, registered, if it may run;
        else None and why not."""
        catalog = self.context.catalog
        space = catalog.space
        stage = trial.suggest_categorical(STAGE_PARAM, space.stages)
        micro = trial.suggest_int(MICRO_BATCH_PARAM, 1, max(space.sizes), log=True)
        plans = [plan for plan in space.plans if plan.variant.stage == stage]
        if not plans:
            return None, f"stage {stage} is pruned: {space.pruned.get(f'z{stage}', 'not searched')}"
        offload = self._choose(trial, OFFLOAD_PARAM, {p.variant.offload_optimizer for p in plans})
        checkpointed = self._choose(
            trial, CHECKPOINTING_PARAM, {p.variant.activation_checkpointing for p in plans}
        )
        variant = Variant(stage, offload, checkpointed)
        plan = next((p for p in plans if p.variant == variant), None)
        if plan is None or micro not in plan.ladder:
            return None, f"micro-batch {micro} is not one {variant.label} may run"
        knobs = []
        for key, values in plan.knobs:
            choices = self._knob_choices.setdefault(key, tuple(values))
            value = trial.suggest_categorical(key, choices)
            if value not in values:
                return None, f"{key}={value!r} is not searched at {variant.label}"
            knobs.append((key, value))
        name = catalog.register(variant, micro, tuple(knobs))
        if not catalog.is_open(name):
            return None, f"{name} was measured or is pruned"
        return name, ""

    @staticmethod
    def _choose(trial: optuna.Trial, param: str, options: set[bool]) -> bool:
        """A variant's switch: the sampler's choice where the stage has both, else the one."""
        if len(options) == 1:
            return next(iter(options))
        return bool(trial.suggest_categorical(param, (False, True)))


def _fail() -> Any:
    from optuna.trial import TrialState

    return TrialState.FAIL
