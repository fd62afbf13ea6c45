"""Early stopping: how many experiments a search phase has run since its last new best."""

from __future__ import annotations

from collections.abc import Container

from autotune.config import Metric
from autotune.tuner.ledger import Ledger
from autotune.tuner.ranking import score


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
