"""How much one measurement varies, and what that says of a ranking: the expected loss of
declaring a leader (:func:`expected_loss`), how far a median wanders (:func:`median_sd`), and
windows too short to rank on (:func:`short_windows`)."""

from __future__ import annotations

import math
import statistics

from autotune.experiment import ExperimentResult
from autotune.tuner.cost_model import normal_cdf
from autotune.tuner.history import History
from autotune.tuner.ranking import TOLERANCE, Ranked

# A profile window shorter than this measures the machine's jitter (on 2 CPU cores, windows
# of 0.1 s varied by 36-162% run to run): such configurations are never raced, and the
# summary says to lengthen the window.
MIN_WINDOW_S = 0.5


def expected_loss(leader: Ranked, rival: Ranked, noise: float, lower_is_better: bool) -> float:
    """The expected share by which ``rival`` beats ``leader`` beyond the tolerance:
    E[max(0, d - t)] for d, the log of how much better the rival is, ~ N(gap, se²) with se the
    noise of the two medians (:func:`median_sd`), t = log(1 + tolerance).

    Example:
        >>> lead, tie = Ranked("a", 100, (100,), 0), Ranked("b", 100, (100,), 0)
        >>> round(expected_loss(lead, tie, 0.03, False), 4)  # one measurement each
        0.0088
        >>> lead2, tie2 = Ranked("a", 100, (99, 101), 0), Ranked("b", 100, (99, 101), 0)
        >>> round(expected_loss(lead2, tie2, 0.03, False), 4)  # two each: less
        0.0046
    """
    if leader.value <= 0 or rival.value <= 0:
        return 0.0
    gap = math.log(rival.value) - math.log(leader.value)
    if lower_is_better:
        gap = -gap
    se = math.hypot(
        median_sd(noise, leader.num_measurements), median_sd(noise, rival.num_measurements)
    )
    t = math.log(1 + TOLERANCE)
    z = (gap - t) / se
    density = math.exp(-0.5 * z * z) / math.sqrt(2 * math.pi)
    return max(0.0, se * density + (gap - t) * normal_cdf(z))


def median_sd(noise: float, count: int) -> float:
    """How far the median of ``count`` measurements with relative noise ``noise`` wanders: the
    mean's ``noise / sqrt(n)`` for one or two (their median is their mean), about 1.25 times
    that from three on.

    Example:
        >>> [round(median_sd(0.1, n), 4) for n in (1, 2, 4)]
        [0.1, 0.0707, 0.0625]
    """
    return noise / math.sqrt(count) * (1.25 if count >= 3 else 1.0)


def is_quiet(result: ExperimentResult) -> bool:
    """Ran ok, the whole window, with nothing competing for the ranks' cores."""
    return (
        result.ok
        and result.metrics is not None
        and not result.metrics.disturbed
        and result.stopped_after_steps is None
    )


def short_windows(history: History) -> dict[str, float]:
    """Configurations whose profile window lasted under :data:`MIN_WINDOW_S` (median over
    their ok runs), with that median."""
    windows: dict[str, list[float]] = {}
    for name, result in history.results.items():
        if result.ok and result.timings.window_s > 0 and result.stopped_after_steps is None:
            windows.setdefault(history.config_of(name), []).append(result.timings.window_s)
    medians = {name: statistics.median(seconds) for name, seconds in windows.items()}
    return {name: s for name, s in medians.items() if s < MIN_WINDOW_S}
