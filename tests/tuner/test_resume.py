"""Resuming: a new tuner told the results log continues where the old one stopped."""

from __future__ import annotations

import pytest

from autotune.experiment import ExperimentResult
from autotune.tuner import Candidate, Tuner
from tests.tuner.landscape import FakeClock, Landscape, Tied, drive
from tests.tuner.tuners import small_tuner


def run_some(tuner: Tuner, landscape: Landscape, count: int) -> list[ExperimentResult]:
    log = []
    for _ in range(count):
        candidate = tuner.ask()
        assert candidate is not None
        log.append(landscape.run(candidate))
        tuner.tell(log[-1])
    return log


@pytest.mark.parametrize("interrupt_after", [1, 5, 9, 14])
def test_replaying_the_log_continues_the_same_search(tuner_type: str, interrupt_after: int) -> None:
    landscape = Landscape(noise=0.05)
    whole = [c.name for c in drive(small_tuner(tuner_type), landscape)]
    interrupt_after = min(interrupt_after, len(whole) - 1)

    log = run_some(small_tuner(tuner_type), landscape, interrupt_after)
    resumed = small_tuner(tuner_type)
    for result in log:
        resumed.tell(result)
    rest = [c.name for c in drive(resumed, landscape)]

    names = [r.name for r in log] + rest
    assert len(set(names)) == len(names), "a finished experiment ran again"
    assert names == whole  # every decision follows from the results: the uninterrupted run
    assert resumed.finished and resumed.summary().num_run == len(names)


def test_an_experiment_in_flight_when_interrupted_is_proposed_again(tuner_type: str) -> None:
    landscape = Landscape()
    first = small_tuner(tuner_type)
    log = run_some(first, landscape, 3)
    lost: Candidate | None = first.ask()  # launched, then the driver died
    assert lost is not None
    resumed = small_tuner(tuner_type)
    for result in log:
        resumed.tell(result)
    later = [c.name for c in drive(resumed, landscape)]
    assert later[0] == lost.name


def test_replayed_time_counts_toward_the_budget() -> None:
    landscape, clock = Tied(duration_s=10.0), FakeClock()  # a best in doubt: room kept
    log = run_some(small_tuner("gridsearch"), landscape, 4)
    resumed = small_tuner("gridsearch", clock=clock, time_budget_s=65.0)
    for result in log:
        resumed.tell(result)
    assert resumed.elapsed_s == 40.0
    # 25 s left: one more search experiment, then a re-measurement of the best (10 s each).
    assert [c.repeat_of is None for c in drive(resumed, landscape, clock=clock)] == [True, False]
