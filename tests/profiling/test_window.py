"""Step-time statistics over the profile window, and the step timer."""

from __future__ import annotations

import math

import pytest

from autotune.profiling import StepTimer, WindowStats, window_stats


def test_window_stats() -> None:
    stats = window_stats([1.0, 3.0, 2.0, 2.0, 2.0])
    assert stats == WindowStats(
        num_steps=5,
        median_s=2.0,
        mean_s=2.0,
        min_s=1.0,
        max_s=3.0,
        spread=1.0,
        iqr_spread=0.0,
    )


def test_iqr_spread_ignores_one_outlier() -> None:
    stats = window_stats([1.0, 1.0, 1.0, 1.0, 10.0])
    assert stats.spread == pytest.approx(9.0)
    assert stats.iqr_spread == 0.0
    assert stats.mean_s == pytest.approx(2.8)


def test_single_step_has_no_spread() -> None:
    stats = window_stats([0.5])
    assert (stats.median_s, stats.spread, stats.iqr_spread) == (0.5, 0.0, 0.0)


def test_zero_durations_do_not_divide_by_zero() -> None:
    assert window_stats([0.0, 0.0]).spread == 0.0


@pytest.mark.parametrize("durations", [[], [1.0, -0.1], [math.nan], [math.inf]])
def test_window_stats_rejects(durations: list[float]) -> None:
    with pytest.raises(ValueError):
        window_stats(durations)


def test_step_timer_laps_with_sync() -> None:
    ticks = iter([10.0, 10.5, 11.5, 11.75])
    syncs: list[None] = []
    timer = StepTimer(sync=lambda: syncs.append(None), clock=lambda: next(ticks))
    timer.start()
    assert [timer.lap(), timer.lap(), timer.lap()] == [0.5, 1.0, 0.25]
    assert timer.durations_s == [0.5, 1.0, 0.25]
    assert timer.total_s == 1.75
    assert len(syncs) == 4  # every clock reading waits for the work before it


def test_step_timer_needs_start() -> None:
    with pytest.raises(RuntimeError, match="before start"):
        StepTimer().lap()
