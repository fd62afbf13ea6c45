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


def ends_early(timer: StepTimer, window_steps: int, stop_above_step_s: float | None) -> bool:
    """Whether a profile window of ``window_steps`` steps ends after the step ``timer`` just
    timed, because even the fastest of its steps so far took longer than ``stop_above_step_s``
    (a loser: it cannot come within the tolerance of the leader).

    Never after the window's last step (it ends there anyway) nor without a threshold. In a
    process group every rank takes rank 0's decision, on rank 0's step times (those the
    metrics report): a rank that went on alone would wait forever in its next collective. The
    agreement is one broadcast per step; the clock restarts after it, behind ``timer``'s
    synchronisation, so neither counts in the next step's time.

    Example (one process, no process group):
        >>> ticks = iter([0.0, 2.0, 2.0, 3.0])  # steps of 2.0 and 1.0 s
        >>> timer = StepTimer(clock=lambda: next(ticks))
        >>> timer.start()
        >>> _ = timer.lap()
        >>> ends_early(timer, window_steps=3, stop_above_step_s=1.5)
        True
        >>> _ = timer.lap()  # had it gone on: its fastest step is now under the threshold
        >>> ends_early(timer, window_steps=3, stop_above_step_s=1.5)
        False
    """
    if stop_above_step_s is None or len(timer.durations_s) >= window_steps:
        return False
    fastest_s = min(timer.durations_s)
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        fastest_s = _rank0_value(fastest_s)
        timer.start()
    return fastest_s > stop_above_step_s


def _rank0_value(value: float) -> float:
    """``value`` as rank 0 holds it, on every rank of the default process group."""
    import torch
    import torch.distributed as dist

    on_gpu = dist.get_backend() == "nccl"
    device = torch.device("cuda", torch.cuda.current_device()) if on_gpu else torch.device("cpu")
    tensor = torch.tensor([value], dtype=torch.float64, device=device)
    dist.broadcast(tensor, src=0)
    return float(tensor.item())
