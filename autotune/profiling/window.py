"""Timing the profile window's steps and summarising how much they vary."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class WindowStats:
    """Summary of per-step durations, in seconds."""

    num_steps: int
    median_s: float
    mean_s: float
    min_s: float
    max_s: float
    spread: float
    """``(max - min) / median``: 0.5 means the slowest step took half a median step longer
    than the fastest."""
    iqr_spread: float
    """Interquartile range over the median: like ``spread``, but one outlier step does not
    move it."""


def window_stats(durations_s: Sequence[float]) -> WindowStats:
    """Summarise the durations of the steps in a profile window.

    Args:
        durations_s: Seconds per step, in any order; at least one.

    Returns:
        Median, mean, extremes and relative spreads. A single step has spreads of 0.

    Raises:
        ValueError: ``durations_s`` is empty or holds a negative or non-finite value.

    Example:
        >>> round(window_stats([1.0, 1.1, 0.9, 1.0]).spread, 3)
        0.2
    """
    values = [float(d) for d in durations_s]
    if not values:
        raise ValueError("no step durations to summarise")
    if any(not (0.0 <= d < float("inf")) for d in values):
        raise ValueError(f"step durations must be finite and non-negative, got {values}")
    median = statistics.median(values)
    if len(values) > 1:
        q1, _, q3 = statistics.quantiles(values, n=4, method="inclusive")
    else:
        q1 = q3 = values[0]

    def relative(width: float) -> float:
        return width / median if median > 0 else 0.0

    return WindowStats(
        num_steps=len(values),
        median_s=median,
        mean_s=statistics.fmean(values),
        min_s=min(values),
        max_s=max(values),
        spread=relative(max(values) - min(values)),
        iqr_spread=relative(q3 - q1),
    )


class StepTimer:
    """Wall-clock durations of consecutive steps, each ended by a synchronisation.

    ``sync`` makes the clock honest: on CUDA pass ``torch.cuda.synchronize`` (kernels are
    asynchronous), across ranks a barrier, so a step ends when every rank's work has.

    Example:
        >>> ticks = iter([0.0, 1.0, 2.1, 3.0])  # a stand-in clock: steps of 1.0, 1.1, 0.9 s
        >>> timer = StepTimer(clock=lambda: next(ticks))
        >>> timer.start()
        >>> for _ in range(3):
        ...     seconds = timer.lap()  # after each training step
        >>> stats = window_stats(timer.durations_s)
        >>> stats.median_s, round(stats.spread, 3)
        (1.0, 0.2)
    """

    def __init__(
        self,
        sync: Callable[[], None] | None = None,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self._sync = sync
        self._clock = clock
        self._last: float | None = None
        self.durations_s: list[float] = []

    def _now(self) -> float:
        if self._sync is not None:
            self._sync()
        return self._clock()

    def start(self) -> None:
        """Start (or restart) timing: the next ``lap`` measures from here."""
        self._last = self._now()

    def lap(self) -> float:
        """End the current step and start the next.

        Returns:
            The step's duration in seconds.

        Raises:
            RuntimeError: ``start`` was not called.
        """
        if self._last is None:
            raise RuntimeError("StepTimer.lap() called before start()")
        now = self._now()
        duration = now - self._last
        self._last = now
        self.durations_s.append(duration)
        return duration

    @property
    def total_s(self) -> float:
        """Seconds from ``start`` to the last ``lap``."""
        return sum(self.durations_s)
