"""When the search and the run end, and why: the one place that decides it and keeps the reason.

The rules, each with the reason it gives (:class:`~autotune.tuner.reasons.StopKind`):

- The whole run ends, whatever it is doing, once ``time_budget_s`` is spent
  (``time_budget_spent``), once its first :data:`SAME_FAILURE_LIMIT` experiments all failed
  with the same error (``same_failure``: a failure the config does not cause would fail every
  other experiment too), or once a script is seen to stop after as many steps whatever the
  micro-batch (``step_limit``).
- A search phase that has nothing more to propose ended for the first of: the trial cap
  (``trial_cap``: ``tuner_num_trials`` counts every experiment started, one kept for measuring
  a doubted leader again), ``tuner_early_stopping`` experiments without a new best
  (``no_better``), the cost model's word that nothing left could beat the best
  (``model_converged``); else it ran all it had (``exhausted``, once the last phase ends).
- An experiment the time budget has no room for ends the search (``time_budget_kept``: the
  rest of the budget goes to re-measuring; ``time_budget`` without re-measuring) or, while
  re-measuring, the run (``time_budget``).
"""

from __future__ import annotations

import re
from collections.abc import Container
from typing import TYPE_CHECKING

from autotune.config import AutotuningConfig, Metric
from autotune.experiment import Status
from autotune.tuner.bounds import Bounds
from autotune.tuner.budget import RunClock, TimeBudget
from autotune.tuner.busy import quiet_at, quiet_wait_s
from autotune.tuner.candidate import Decision, DecisionKind, Phase, Step, StepKind
from autotune.tuner.history import Experiment, History
from autotune.tuner.ranking import TOLERANCE, score
from autotune.tuner.reasons import StopKind, StopReason
from autotune.tuner.remeasure import CONTROL_AT_END, Remeasurement

if TYPE_CHECKING:
    from autotune.tuner.record import RunRecord

# Experiments that all failed with the same error, and none ok, that end the run: a failure
# that does not depend on the config would fail every remaining experiment too.
SAME_FAILURE_LIMIT = 3
# What differs between two reports of one error: numbers (argparse echoes the value it
# rejects), and the addresses and ids a runtime prints (Ray's actor ids, 0x... addresses).
_VARYING = re.compile(r"0x[0-9a-fA-F]+|\b[0-9a-fA-F]{8,}\b|\d+")


class Stopping:
    """The rules that end the search and the run (see the module docstring), over what the
    study says (``history``), and the driver's next step by them; it keeps nothing: what
    ended, and why, is recorded in the study (:class:`~autotune.tuner.record.RunRecord`).

    Args:
        history: what the study says of the run.
        tuning: the ``autotuning`` section (trial cap, early stopping, end of the window).
        bounds: what failures say of the space (a script's step limit).
        remeasure: re-measurement (whether the leader is in doubt: the last slot is kept).
        budget: the time budget (None: the samplers', which know no clock).
        busy_before_start: whether a neighbour held the node's cores before the run began
            (how long a busy machine is waited for).
    """

    def __init__(
        self,
        history: History,
        tuning: AutotuningConfig,
        bounds: Bounds,
        remeasure: Remeasurement | None = None,
        budget: TimeBudget | None = None,
        busy_before_start: bool | None = None,
    ) -> None:
        self._history = history
        self._tuning = tuning
        self._bounds = bounds
        self._remeasure = remeasure
        self._budget = budget
        self._busy_before_start = busy_before_start

    @classmethod
    def for_driver(
        cls,
        history: History,
        tuning: AutotuningConfig,
        clock: RunClock,
        run: RunRecord,
        busy_before_start: bool | None,
    ) -> Stopping:
        """The driver's rules on ``history``: with re-measurement (and the waits for a quiet
        machine ``run`` recorded) and the time budget on ``clock``."""
        remeasure = Remeasurement(history, tuning, quiet_at(run.waits))
        budget = TimeBudget(history, tuning.time_budget_s, clock)
        return cls(history, tuning, Bounds(history), remeasure, budget, busy_before_start)

    @property
    def remeasure(self) -> Remeasurement:
        assert self._remeasure is not None, "the driver's rules"
        return self._remeasure

    @property
    def budget(self) -> TimeBudget:
        assert self._budget is not None, "the driver's rules"
        return self._budget

    # --- the driver's steps -------------------------------------------------------------------

    def owed(self, open_here: Container[str]) -> Experiment | None:
        """The first experiment a killed run left running (in flight, yet not this
        process's): it runs again before anything else, as it would have ended first."""
        owed = [e for e in self._history.pending.values() if e.name not in open_here]
        return min(owed, key=lambda e: e.number) if owed else None

    def search_step(self, decision: Decision) -> Step:
        """While the search runs: the trial cap ends it (once what is in flight is in); the
        control is measured again when due; else the search's ``decision``: its proposal if
        the time budget has room for it (else the search ends, the rest of the budget kept
        for re-measuring), or wait, or the search is over (a ``model_based`` search with
        nothing to beat a doubted leader measures it again first, and decides again)."""
        history, phase = self._history, decision.phase
        remeasure, budget = self.remeasure, self.budget
        if decision.name is not None and decision.entry is not None:
            history.register(decision.name, decision.entry)  # the walk's, known here too
        if self.search_capped():
            if history.pending:
                return Step(StepKind.wait, phase)
            return Step(StepKind.end_search, phase, stop=self.trial_cap())
        repeat = remeasure.control_due()
        if repeat is None and decision.kind is DecisionKind.end and decision.confirm_leader:
            repeat = remeasure.control_due(every=CONTROL_AT_END) or remeasure.confirmation()
        if repeat is None and decision.kind is DecisionKind.ask:
            return Step(StepKind.ask, phase)
        name = repeat or decision.name
        if name is None:
            if decision.kind is DecisionKind.wait:
                return Step(StepKind.wait, phase)
            return Step(StepKind.end_search, phase, stop=decision.stop)
        if not budget.fits(name, keep_for=remeasure.doubted_leader()):
            kept = self._tuning.num_remeasure > 0
            stop = self.time(StopKind.time_budget_kept if kept else StopKind.time_budget)
            return Step(StepKind.end_search, phase, stop=stop, left=name)
        if repeat is None:
            return Step(StepKind.run, phase, name, decision.entry)
        config = history.config_of(repeat)
        return Step(StepKind.run, phase, repeat, history.entries[config], config)

    def remeasure_step(self, run: RunRecord) -> Step:
        """Once the search is over: the next re-measurement (decided on every result before
        it), within the trial cap and the time budget; a busy machine is waited for first;
        else the run is over."""
        history, phase = self._history, Phase.remeasure
        remeasure, budget = self.remeasure, self.budget
        if history.pending:
            return Step(StepKind.wait, phase)
        if self.trials_left() <= 0:
            stop = None if run.search_stop else self.trial_cap()
            return Step(StepKind.end_run, phase, stop=stop)
        name = remeasure.next()
        if name is None:
            wait_s = quiet_wait_s(
                remeasure.waits_for_quiet(), budget, run.waits, self._busy_before_start
            )
            if wait_s is not None:
                return Step(StepKind.quiet, phase, wait_s=wait_s)
            return Step(StepKind.end_run, phase)
        if not budget.fits(name, keep_for=None):
            stop = self.time(StopKind.time_budget)
            return Step(StepKind.end_run, phase, stop=stop, left=name)
        config = history.config_of(name)
        return Step(StepKind.run, phase, name, history.entries[config], config)

    # --- the rules ----------------------------------------------------------------------------

    def run_end(self) -> StopReason | None:
        """Why the whole run ends now, whatever it is doing; None: it goes on."""
        if self._budget is not None and self._budget.spent:
            return self.time(StopKind.time_budget_spent)
        if (error := self.same_failure()) is not None:
            return StopReason(StopKind.same_failure, (SAME_FAILURE_LIMIT, error))
        if (steps := self._bounds.step_limit()) is not None:
            return StopReason(StopKind.step_limit, (steps, self._tuning.end_profile_step))
        return None

    def phase_end(self, phase: Phase, patience: Container[str] | None) -> StopReason | None:
        """Why ``phase``, which has nothing more to propose, ended: a limit it reached, or
        None where it ran all it had. ``patience``: the configurations early stopping counts
        in it (None: it does not apply)."""
        if patience is not None and self.patience_spent(phase, patience):
            return StopReason(StopKind.no_better, (self._tuning.tuner_early_stopping,))
        if phase is Phase.model and self._history.results:
            return StopReason(StopKind.model_converged, (TOLERANCE,))
        return None

    def trial_cap(self) -> StopReason:
        return StopReason(StopKind.trial_cap, (self._tuning.tuner_num_trials,))

    def trials_left(self) -> int:
        """Experiments ``tuner_num_trials`` still allows, those in flight counted as run."""
        spent = len(self._history.results) + len(self._history.pending)
        return self._tuning.tuner_num_trials - spent

    def search_capped(self) -> bool:
        """Whether the search may start no more experiments: the cap reached, but for one
        kept for measuring the best again while it is in doubt."""
        left = self.trials_left()
        if left != 1:  # the doubt (a ranking and the noise) is weighed only at the last slot
            return left <= 0
        return self._remeasure is not None and self._remeasure.doubted_leader() is not None

    def patience_spent(self, phase: Phase, names: Container[str]) -> bool:
        """Whether ``tuner_early_stopping`` experiments of ``phase`` (``names``) ran without a
        new best (:func:`experiments_since_best`)."""
        since = experiments_since_best(
            self._history,
            names,
            self._tuning.metric,
            knobs_later=phase is Phase.micro_batch,
            # A search that learns where memory ends from failures has not stopped paying off.
            failures_count=phase not in (Phase.model, Phase.sampler),
        )
        return since >= self._tuning.tuner_early_stopping

    def same_failure(self) -> str | None:
        """The first error line, once the first :data:`SAME_FAILURE_LIMIT` experiments all
        failed alike (their messages equal but for numbers, addresses and ids) and none ran
        ok; None otherwise. ``oom``, ``timeout`` and running out of data depend on the
        config: any of them means the config matters, so the run goes on."""
        results = [self._history.results[name] for name in self._history.order]
        if len(results) < SAME_FAILURE_LIMIT:
            return None
        if any(r.status is not Status.error or r.ended_early for r in results):
            return None
        if len({_VARYING.sub("N", r.error or "") for r in results}) != 1:
            return None
        return results[0].error or "(no message)"

    def time(self, kind: StopKind) -> StopReason:
        """The time budget's reason of ``kind``, with its seconds."""
        seconds = self._budget.seconds if self._budget is not None else None
        assert seconds is not None, "only a time budget ends the search for time"
        return StopReason(kind, (seconds,))


def experiments_since_best(
    history: History,
    phase_names: Container[str],
    metric: Metric,
    *,
    knobs_later: bool,
    failures_count: bool = True,
) -> int:
    """Experiments of the phase (``phase_names``) since the last new best (of any phase), in
    the order they were proposed.

    One in flight, and every one proposed after it, counts as no better: an upper bound,
    exact once nothing is in flight, so that experiments running side by side never go past
    where a one-at-a-time run would have stopped. ``knobs_later``: knob experiments belong to
    a later phase (the micro-batch phase runs), so that one replayed from a run that got
    further neither ends nor extends this phase (a resumed run decides each phase on what
    that phase knew). ``failures_count`` False: only experiments that ran ok count (a search
    that learns where memory ends from failures has not stopped paying off).
    """
    best: float | None = None
    since = 0
    unsettled = False
    for name in history.proposed:
        entry = history.entries.get(name)
        if history.is_repeat(name) or entry is None or (knobs_later and not entry.own_knobs):
            continue
        result = history.results.get(name)
        unsettled = unsettled or result is None
        value = None
        if not unsettled and result is not None and result.ok and result.metrics:
            value = score(result.metrics, metric)
        if value is not None and (best is None or value > best):
            best, since = value, 0
        elif (
            name in phase_names
            and not _is_largest_fit(history, name)
            and (failures_count or unsettled or (result is not None and result.ok))
        ):
            # The largest fit is the micro-batch search's result, run before this phase:
            # where it falls among other variants' searches depends on what ran beside it.
            since += 1
    return since


def _is_largest_fit(history: History, name: str) -> bool:
    entry = history.entries.get(name)
    if entry is None or not entry.own_knobs:
        return False
    return history.largest_fit(entry.variant) == entry.micro_batch_size
