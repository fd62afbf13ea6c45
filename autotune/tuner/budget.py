"""How long an experiment will take, from the ones that finished: what fits in a time budget.

``autotuning.time_budget_s`` is the user's wall clock for the whole run. The tuner spends it
so that the run ends on time with its best configuration measured more than once: it starts
an experiment only when the experiment is expected to end within the budget and, while it
searches, leaves enough for one re-measurement of the best so far (see
:meth:`~autotune.tuner.tuner.Tuner.ask`).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from autotune.experiment import Timings, wall_time_s
from autotune.tuner.history import History


def predicted_duration_s(
    micro_batch: int, finished: Sequence[tuple[int, Timings]], own: Sequence[Timings] = ()
) -> float | None:
    """The expected wall time of an experiment at ``micro_batch``, from ``finished`` ones
    (each with its micro-batch); None when nothing finished.

    Its training steps take what its ``own`` earlier runs' took (a re-measurement), else
    what the finished experiment of the nearest size took (the slower of equals), scaled to
    ``micro_batch``. The rest of an experiment (its start-up and the runner's own costs) is
    the median of every finished one's, so that the first experiment, which also started
    the processes, weighs little once others finished.

    Example:
        >>> ran = [(8, Timings(warmup_s=1.0, window_s=1.0, total_s=3.0)),
        ...        (32, Timings(warmup_s=4.0, window_s=4.0, total_s=9.0))]
        >>> predicted_duration_s(16, ran), predicted_duration_s(32, ran)
        (5.0, 9.0)
    """
    if not finished:
        return None
    overhead_s = statistics.median(timings.overhead_s for _, timings in finished)
    if own:
        return overhead_s + statistics.median(t.warmup_s + t.window_s for t in own)
    size, nearest = min(
        finished,
        key=lambda run: (abs(math.log(run[0] / micro_batch)), -run[1].total_s),
    )
    return overhead_s + (nearest.warmup_s + nearest.window_s) * micro_batch / size


def predicted_duration_of(history: History, name: str) -> float | None:
    """How long experiment ``name`` should take (see :func:`predicted_duration_s`): from its
    configuration's own earlier measurements where it has some (a re-measurement), else from
    every configuration's that ran ok."""
    base = history.config_of(name)
    micro_batch = history.entries[base].micro_batch_size
    finished = []
    for result_name, result in history.results.items():
        config = history.config_of(result_name)
        entry = history.entries.get(config)
        if result.ok and entry is not None:
            own = config == base
            finished.append((own, entry.micro_batch_size, result.timings))
    return predicted_duration_s(
        micro_batch,
        [(size, timings) for _, size, timings in finished],
        own=[timings for own, _, timings in finished if own],
    )


@dataclass
class RunClock:
    """This process's clock for a run: where ``time_budget_s`` counts from, when the first
    experiment went out (the run's start-up ends there), and what an earlier process ran
    (a resumed run's results: their wall time was spent too).

    Attributes:
        clock: seconds, monotonic.
        started: the ``clock`` reading the budget counts from.
        first_asked: when this process handed out its first experiment (None: not yet).
        replayed: the experiments an earlier process ran.
    """

    clock: Callable[[], float]
    started: float
    first_asked: float | None = None
    replayed: frozenset[str] = frozenset()

    def asked(self) -> None:
        if self.first_asked is None:
            self.first_asked = self.clock()


class TimeBudget:
    """``time_budget_s`` against the clock: what the run has spent, and whether an experiment
    fits in what is left.

    Args:
        history: what the study says of the run (the finished experiments predict the next).
        seconds: the budget; None: no limit.
        clock: this process's clock for the run.
    """

    def __init__(self, history: History, seconds: float | None, clock: RunClock) -> None:
        self._history = history
        self._seconds = seconds
        self._clock = clock
        self._replayed = [history.results[n] for n in clock.replayed if n in history.results]

    @property
    def elapsed_s(self) -> float:
        """Tuning time: this process's, plus the wall time replayed results took (their
        overlapping intervals counted once)."""
        return self._clock.clock() - self._clock.started + wall_time_s(self._replayed)

    @property
    def spent(self) -> bool:
        return self._seconds is not None and self.elapsed_s >= self._seconds

    @property
    def seconds(self) -> float | None:
        """``time_budget_s`` (None: no budget)."""
        return self._seconds

    def fits(self, name: str, keep_for: str | None) -> bool:
        """Whether ``name`` is expected to end within the budget with time left to end the
        run, and for one re-measurement of ``keep_for`` (the best so far, while the search
        goes on; None: nothing kept). True when nothing can be predicted yet."""
        if self._seconds is None:
            return True
        needed = predicted_duration_of(self._history, name)
        if needed is None:
            return True
        # The run's own start-up (its cluster, before the first experiment) is kept for its
        # end, which stops what it started: an upper bound (a local Ray cluster here took
        # 3.4 s to start and 1.4 s to shut down).
        clock = self._clock
        first_asked = clock.clock() if clock.first_asked is None else clock.first_asked
        needed += first_asked - clock.started
        if keep_for is not None:
            needed += predicted_duration_of(self._history, keep_for) or 0.0
        return self.elapsed_s + needed <= self._seconds
