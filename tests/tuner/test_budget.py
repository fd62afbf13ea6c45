"""The time budget: experiments predicted from finished ones, and a run that ends on time."""

from __future__ import annotations

import pytest

from autotune.experiment import Timings
from autotune.summary_text import stop_text
from autotune.tuner import Tuner
from autotune.tuner.budget import predicted_duration_s
from tests.tuner.landscape import MODEL, FakeClock, Tied, drive
from tests.tuner.tuners import small_config, small_tuner


def test_training_scales_from_the_nearest_micro_batch_and_start_up_is_the_median() -> None:
    first = (8, Timings(warmup_s=1.0, window_s=1.0, total_s=12.0))  # started the processes
    others = [
        (8, Timings(warmup_s=1.0, window_s=1.0, total_s=4.0)),
        (32, Timings(warmup_s=4.0, window_s=4.0, total_s=10.0)),
    ]
    assert predicted_duration_s(64, [first, *others]) == pytest.approx(2.0 + 16.0)
    assert predicted_duration_s(4, [first, *others]) == pytest.approx(2.0 + 1.0)
    assert predicted_duration_s(8, []) is None
    # A re-measurement trains as long as it did before, and starts up as the others do.
    assert predicted_duration_s(8, [first, *others], own=[first[1]]) == pytest.approx(4.0)


def test_nothing_starts_that_would_end_past_the_budget() -> None:
    """Experiments take 2 s plus 0.25 s per sample of their micro-batch (up to 64): the run
    stops short of the budget rather than past it, with its best (in doubt: a tie at 10%
    noise) measured again."""
    clock = FakeClock()
    landscape = Tied(duration_s=2.0, seconds_per_sample=0.25)
    tuner = small_tuner("gridsearch", clock=clock, time_budget_s=80.0)
    asked = drive(tuner, landscape, clock=clock)
    summary = tuner.summary()
    assert summary.tuning_time_s <= 80.0
    assert summary.best is not None and summary.best.num_measurements >= 2
    assert any(c.repeat_of is not None for c in asked)
    assert stop_text(summary.stop).startswith("time budget of 80 s")
    # Unbudgeted, the same search runs longer.
    unbudgeted_clock = FakeClock()
    drive(small_tuner("gridsearch", clock=unbudgeted_clock), landscape, clock=unbudgeted_clock)
    assert unbudgeted_clock.now > 80.0


def test_the_runs_start_up_is_kept_for_its_end() -> None:
    """5 s passed before the first experiment (the cluster's start): the same time is kept
    for stopping it, so the run ends its experiments 5 s short of the budget."""
    clock, landscape = FakeClock(), Tied(duration_s=10.0)  # a best in doubt: room kept
    tuner = Tuner(
        small_config("gridsearch", time_budget_s=55.0),
        MODEL,
        device_memory_bytes=landscape.budget_bytes,
        clock=clock,
        started=-5.0,
    )
    asked = drive(tuner, landscape, clock=clock)
    assert [c.repeat_of is not None for c in asked] == [False, False, False, True]
    assert tuner.summary().tuning_time_s == 45.0
