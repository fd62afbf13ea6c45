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
from collections.abc import Sequence

from autotune.experiment import Timings


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
