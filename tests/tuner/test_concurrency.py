"""Several experiments in flight: the tuner proposes what a one-at-a-time run would, never a
running point twice, and waits (rather than ends) when the next proposal needs a result."""

from __future__ import annotations

import random
from datetime import datetime, timedelta, timezone

import pytest

from autotune.experiment import ExperimentResult, Status, Timings, wall_time_s
from autotune.tuner import Candidate, Phase, Tuner
from tests.tuner.landscape import Landscape, drive, run_until_killed
from tests.tuner.tuners import small_tuner


def drive_concurrently(
    tuner: Tuner, landscape: Landscape, slots: int, seed: int
) -> tuple[list[Candidate], int]:
    """Keep up to ``slots`` in flight, finishing them in a random order; the candidates in
    the order asked, and the most that were ever in flight at once."""
    finish_order = random.Random(seed)
    asked: list[Candidate] = []
    in_flight: dict[str, Candidate] = {}
    most = 0
    while True:
        while len(in_flight) < slots and (candidate := tuner.ask()) is not None:
            assert candidate.name not in in_flight, "a running point was proposed again"
            assert candidate.name not in {c.name for c in asked}, "a finished point ran again"
            asked.append(candidate)
            in_flight[candidate.name] = candidate
        most = max(most, len(in_flight))
        if not in_flight:
            assert tuner.finished, "ask() said nothing now, yet nothing is in flight"
            return asked, most
        assert not tuner.finished
        done = in_flight.pop(finish_order.choice(sorted(in_flight)))
        tuner.tell(landscape.run(done))


@pytest.mark.parametrize("tuner_type", ["gridsearch", "random"])
@pytest.mark.parametrize("slots", [2, 4])
def test_the_same_experiments_as_one_at_a_time(tuner_type: str, slots: int) -> None:
    """Early stopping and the trial cap count what is in flight, so out-of-order results
    never make the search run past where the sequential run stopped."""
    landscape = Landscape(noise=0.05)
    settings = {"tuner_early_stopping": 3, "tuner_num_trials": 14, "num_remeasure": 2}
    one_at_a_time = small_tuner(tuner_type, **settings)
    sequential = {c.name for c in drive(one_at_a_time, landscape)}
    sequential_best = one_at_a_time.summary().best.name  # type: ignore[union-attr]
    for seed in range(3):
        tuner = small_tuner(tuner_type, **settings)
        asked, most = drive_concurrently(tuner, landscape, slots, seed)
        assert {c.name for c in asked} == sequential
        assert most > 1
        best = tuner.summary().best
        assert best is not None and best.name == sequential_best


def test_model_based_never_proposes_a_running_point_and_keeps_the_cap() -> None:
    landscape = Landscape(noise=0.05)
    # 8: fewer than the 10 its cost model runs uncapped here.
    tuner = small_tuner("model_based", tuner_num_trials=8, num_remeasure=0)
    asked, most = drive_concurrently(tuner, landscape, slots=4, seed=0)
    assert len({c.name for c in asked}) == len(asked) == 8
    assert most == 4


def test_ask_waits_for_a_result_the_next_proposal_depends_on() -> None:
    """One variant's micro-batch descent: the next size depends on whether this one fits."""
    tuner = small_tuner("gridsearch")
    first = tuner.ask()
    second = tuner.ask()
    assert first is not None and second is not None
    assert first.phase is second.phase is Phase.max_micro_batch
    assert first.stage != second.stage  # one probe per variant runs at a time
    assert tuner.ask() is None and not tuner.finished  # "wait", not "done"
    landscape = Landscape()
    tuner.tell(landscape.run(first))
    tuner.tell(landscape.run(second))
    assert tuner.ask() is not None


def test_early_stopping_waits_for_results_that_may_still_bring_a_new_best() -> None:
    tuner = small_tuner("gridsearch", tuner_early_stopping=2, num_remeasure=0)
    landscape = Landscape()
    while tuner.phase is Phase.max_micro_batch:  # through the probes, one at a time
        candidate = tuner.ask()
        if candidate is not None:
            tuner.tell(landscape.run(candidate))
    in_flight = []
    while (candidate := tuner.ask()) is not None:
        in_flight.append(candidate)
    assert len(in_flight) <= 2  # never more than patience allows without a new result
    assert not tuner.finished and tuner.summary().stop is None


def test_replayed_experiments_that_overlapped_count_their_wall_time_once() -> None:
    start = datetime(2026, 1, 1, tzinfo=timezone.utc)

    def ran(name: str, offset_s: float, duration_s: float) -> ExperimentResult:
        began = (start + timedelta(seconds=offset_s)).isoformat(timespec="milliseconds")
        return ExperimentResult(
            name, Status.ok, started_at=began, timings=Timings(total_s=duration_s)
        )

    side_by_side = [ran("a", 0, 10), ran("b", 2, 10), ran("c", 20, 5)]
    assert wall_time_s(side_by_side) == pytest.approx(17.0)
    assert wall_time_s([ExperimentResult("x", Status.ok, timings=Timings(total_s=4))]) == 4.0


@pytest.mark.parametrize("tuner_type", ["gridsearch", "random"])
@pytest.mark.parametrize("interrupt_after", [2, 6, 9, 13])
def test_a_resume_with_several_cut_off_runs_what_one_at_a_time_would(
    tuner_type: str, interrupt_after: int
) -> None:
    """Killed with three in flight: replayed in proposal order, the cut-off ones owed in
    their places, the resumed run runs exactly the sequential run's experiments."""
    landscape = Landscape(noise=0.05)
    settings = {"tuner_early_stopping": 3, "tuner_num_trials": 14, "num_remeasure": 2}
    sequential = {c.name for c in drive(small_tuner(tuner_type, **settings), landscape)}
    for seed in range(3):
        killed = run_until_killed(
            small_tuner(tuner_type, **settings), landscape, interrupt_after, seed
        )
        resumed = killed.resumed(small_tuner, tuner_type, **settings)
        rest = drive(resumed, landscape)
        assert set(killed.in_flight) <= {c.name for c in rest}, "a cut-off experiment was lost"
        assert set(killed.finished) | {c.name for c in rest} == sequential
        assert not set(killed.finished) & {c.name for c in rest}
