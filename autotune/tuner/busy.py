"""A busy machine: when other processes competing for the ranks' cores decide what a run
measured (:func:`busy`), and how long the run waits for the machine to quiet down before
declaring the answer on what it has (:func:`quiet_wait_s`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from autotune.tuner.history import History

if TYPE_CHECKING:
    from autotune.tuner.budget import TimeBudget
    from autotune.tuner.record import QuietWait

# Measurements in a row taken while other processes competed for the cores that say the
# machine is busy now (a neighbour's job, not a passing burst): measuring again to find the
# quiet machine waits until a quiet measurement says it is back.
BUSY_STREAK = 3
BUSY_SHARE = 0.9
# Before declaring what a busy machine measured, the run waits for it to quiet down for at
# most a share of its time so far (all waits together), and not for less than
# MIN_QUIET_WAIT_S. A neighbour already busy before the run's first experiment is the
# machine's state: a fifth (one that stays costs the run a fifth more; a busy machine's run
# then takes 1.8-1.9 times one pass over what it searched, within the 2x bound). One that
# came during the run is more likely passing: half.
QUIET_WAIT_SHARE = 0.2
ARRIVED_WAIT_SHARE = 0.5
MIN_QUIET_WAIT_S = 2.0


def busy(history: History, quiet_at: int | None) -> bool:
    """Whether the machine is busy throughout, not in a passing burst: the last
    :data:`BUSY_STREAK` measurements that ran ok, and :data:`BUSY_SHARE` of all of them, were
    taken while other processes competed for the ranks' cores. Such a machine's measurements
    are not rescued by measuring again: the next meets it busy too. A burst is waited out
    (measured again until a quiet measurement comes). ``quiet_at``: how many results were in
    when the machine was last seen quiet (it is not busy until a later measurement says so).
    """
    if quiet_at is not None and quiet_at >= len(history.order):
        return False  # seen quiet since the last measurement
    disturbed = [
        result.metrics.disturbed
        for result in (history.results[name] for name in history.order)
        if result.ok and result.metrics is not None
    ]
    recent = disturbed[-BUSY_STREAK:]
    if len(recent) < BUSY_STREAK or not all(recent):
        return False
    return sum(disturbed) >= BUSY_SHARE * len(disturbed)


def quiet_wait_s(
    remeasured_when_quiet: bool,
    budget: TimeBudget,
    waits: Sequence[QuietWait],
    busy_before_start: bool | None,
) -> float | None:
    """How long to wait for a quiet machine before declaring what a busy one measured, or
    None: nothing to wait for. A share of the run so far (all waits together), larger where
    the node was quiet before the run began (:data:`ARRIVED_WAIT_SHARE`: a neighbour that came
    during the run is likely passing), within the time budget; not again once a wait ended
    with the machine still busy (``waits``: the run's so far). ``remeasured_when_quiet``:
    whether measuring again on a quiet machine is what the answer waits for."""
    if any(not wait.quiet for wait in waits) or not remeasured_when_quiet:
        return None
    share = QUIET_WAIT_SHARE if busy_before_start is not False else ARRIVED_WAIT_SHARE
    seconds = share * budget.elapsed_s - sum(wait.waited_s for wait in waits)
    if budget.seconds is not None:
        seconds = min(seconds, budget.seconds - budget.elapsed_s)
    return seconds if seconds >= MIN_QUIET_WAIT_S else None


def quiet_at(waits: Sequence[QuietWait]) -> int | None:
    """How many results were in when the machine was last seen quiet (None: never)."""
    return max((wait.after for wait in waits if wait.quiet), default=None)
