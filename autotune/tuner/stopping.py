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

from autotune.config import AutotuningConfig, Metric
from autotune.experiment import Status
from autotune.tuner.bounds import Bounds
from autotune.tuner.budget import TimeBudget
from autotune.tuner.candidate import Phase
from autotune.tuner.ledger import Ledger
from autotune.tuner.ranking import TOLERANCE, score
from autotune.tuner.reasons import StopKind, StopReason
from autotune.tuner.remeasure import Remeasurement

# Experiments that all failed with the same error, and none ok, that end the run: a failure
# that does not depend on the config would fail every remaining experiment too.
SAME_FAILURE_LIMIT = 3
# What differs between two reports of one error: numbers (argparse echoes the value it
# rejects), and the addresses and ids a runtime prints (Ray's actor ids, 0x... addresses).
_VARYING = re.compile(r"0x[0-9a-fA-F]+|\b[0-9a-fA-F]{8,}\b|\d+")


class Stopping:
    """Decides when the search and the run end (see the module docstring) and keeps why.

    Args:
        ledger: what the tuner has seen.
        tuning: the ``autotuning`` section (trial cap, early stopping, end of the window).
        bounds: what failures say of the space (a script's step limit).
        budget: the time budget.
        remeasure: re-measurement (whether the leader is in doubt: the last slot is kept).
    """

    def __init__(
        self,
        ledger: Ledger,
        tuning: AutotuningConfig,
        bounds: Bounds,
        budget: TimeBudget,
        remeasure: Remeasurement,
    ) -> None:
        self._ledger = ledger
        self._tuning = tuning
        self._bounds = bounds
        self._budget = budget
        self._remeasure = remeasure
        self._reason: StopReason | None = None

    @property
    def reason(self) -> StopReason | None:
        """Why the search (the last phase that ended for a reason), or the run, ended; None:
        it has not, or it ran all it had."""
        return self._reason

    def ended(self, reason: StopReason | None) -> None:
        """The search or the run ended for ``reason`` (None: a phase ran all it had, which
        keeps the reason an earlier limit gave)."""
        if reason is not None:
            self._reason = reason

    def phase_begins(self) -> None:
        """A search phase with something to do begins: it ends for its own reason."""
        self._reason = None

    def exhausted(self) -> None:
        """The last phase ended with nothing left and no limit reached."""
        if self._reason is None:
            self._reason = StopReason(StopKind.exhausted)

    # --- the rules ----------------------------------------------------------------------------

    def run_end(self) -> StopReason | None:
        """Why the whole run ends now, whatever it is doing; None: it goes on."""
        if self._budget.spent:
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
        if phase is Phase.remeasure:
            return None
        if self.search_capped():
            return StopReason(StopKind.trial_cap, (self._tuning.tuner_num_trials,))
        if patience is not None and self.patience_spent(phase, patience):
            return StopReason(StopKind.no_better, (self._tuning.tuner_early_stopping,))
        if phase is Phase.model and self._ledger.results:
            return StopReason(StopKind.model_converged, (TOLERANCE,))
        return None

    def trials_left(self) -> int:
        """Experiments ``tuner_num_trials`` still allows, those in flight counted as run."""
        spent = len(self._ledger.results) + len(self._ledger.pending)
        return self._tuning.tuner_num_trials - spent

    def search_capped(self) -> bool:
        """Whether the search may start no more experiments: the cap reached, but for one
        kept for measuring the best again while it is in doubt."""
        left = self.trials_left()
        if left != 1:  # the doubt (a ranking and the noise) is weighed only at the last slot
            return left <= 0
        return self._remeasure.doubted_leader() is not None

    def patience_spent(self, phase: Phase, names: Container[str]) -> bool:
        """Whether ``tuner_early_stopping`` experiments of ``phase`` (``names``) ran without a
        new best (:func:`experiments_since_best`)."""
        since = experiments_since_best(
            self._ledger,
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
        results = [self._ledger.results[name] for name in self._ledger.order]
        if len(results) < SAME_FAILURE_LIMIT:
            return None
        if any(r.status is not Status.error or r.ended_early for r in results):
            return None
        if len({_VARYING.sub("N", r.error or "") for r in results}) != 1:
            return None
        return results[0].error or "(no message)"

    def time(self, kind: StopKind) -> StopReason:
        """The time budget's reason of ``kind``, with its seconds."""
        seconds = self._budget.seconds
        assert seconds is not None, "only a time budget ends the search for time"
        return StopReason(kind, (seconds,))


def experiments_since_best(
    ledger: Ledger,
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
    for name in ledger.proposed:
        entry = ledger.entries.get(name)
        if ledger.is_repeat(name) or entry is None or (knobs_later and entry.knobs):
            continue
        result = ledger.results.get(name)
        unsettled = unsettled or result is None
        value = None
        if not unsettled and result is not None and result.ok and result.metrics:
            value = score(result.metrics, metric)
        if value is not None and (best is None or value > best):
            best, since = value, 0
        elif (
            name in phase_names
            and not _is_largest_fit(ledger, name)
            and (failures_count or unsettled or (result is not None and result.ok))
        ):
            # The largest fit is the micro-batch search's result, run before this phase:
            # where it falls among other variants' searches depends on what ran beside it.
            since += 1
    return since


def _is_largest_fit(ledger: Ledger, name: str) -> bool:
    entry = ledger.entries.get(name)
    if entry is None or entry.knobs:
        return False
    return ledger.largest_fit(entry.variant) == entry.micro_batch_size
