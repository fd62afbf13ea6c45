"""The chance that a configuration fits in memory, for ``model_based``.

A size no larger than one that ran ok fits; one at or above an ``oom`` does not. Between,
where the variant's memory ends is uncertain: the estimate puts it somewhere (the largest
micro-batch whose estimated bytes fit, within a factor of e^0.5 either way, or within 5% once
its line goes through peaks measured in that variant), and what ran truncates that guess;
without an estimate, the chance falls linearly from the largest fit to the smallest ``oom``
(a bisection, in effect).
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np

from autotune.experiment import Status
from autotune.tuner.cost_model import normal_cdf
from autotune.tuner.history import History
from autotune.tuner.memory import MemoryEstimate
from autotune.tuner.model_search.index import Knobs, SpaceIndex
from autotune.tuner.space import Variant

# Uncertainty of the log of the largest micro-batch that fits, from the memory estimate alone
# (estimates were off by up to 3x on the committed landscapes) and once peaks were measured.
MEMORY_SD_ESTIMATED = 0.5
MEMORY_SD_CALIBRATED = 0.05
# ... and for a variant none of whose peaks was measured, once another's were.
MEMORY_SD_TRANSFERRED = 0.15


class FitChance:
    """What the results in ``history`` say of where memory ends, for the configurations of
    ``index``."""

    def __init__(self, history: History, index: SpaceIndex) -> None:
        self._history = history
        self._index = index

    def probabilities(self, indices: list[int]) -> np.ndarray:
        """The chance that each configuration (by position) fits in memory."""
        ok: dict[Variant, list[int]] = {}
        ooms: dict[tuple[Variant, Knobs], list[int]] = {}
        peaks: dict[Variant, list[tuple[int, int]]] = {}
        for name, result in self._history.results.items():
            entry = self._history.entries.get(name)
            if entry is None:
                continue
            size = entry.micro_batch_size
            if result.ok:
                ok.setdefault(entry.variant, []).append(size)
                if result.metrics is not None and result.metrics.peak_memory_bytes > 0:
                    peaks.setdefault(entry.variant, []).append(
                        (size, result.metrics.peak_memory_bytes)
                    )
            elif result.status is Status.oom:
                ooms.setdefault((entry.variant, entry.knobs), []).append(size)
        boundaries = {variant: self._boundary(variant, peaks) for variant in self._index.plans}
        # Up to stage 2, a higher stage holds less at the same micro-batch: what fit at a lower
        # stage fits here, what ran out of memory at a higher one does here too. (Stage 3's
        # gathered parameters can outweigh what it saves on a small model.) A fit says as much
        # for the variant's other knob values (buckets are small beside activations); running
        # out of memory only for the same ones (a larger bucket may be what did not fit).
        fits_at = {
            variant: max(
                (
                    size
                    for other, sizes in ok.items()
                    for size in sizes
                    if other == variant or self._holds_less(variant, other, size)
                ),
                default=0,
            )
            for variant in self._index.plans
        }
        # A knob point inherits an oom from another whose buffers are no larger.
        fails_at: dict[tuple[Variant, Knobs], list[int]] = {}
        for (other, failed_knobs), sizes in ooms.items():
            failed_buffers = self._index.buffers.get((other, failed_knobs), 0.0)
            for variant, knobs in self._index.groups:
                if self._index.buffers[(variant, knobs)] < failed_buffers:
                    continue
                for size in sizes:
                    if other == variant or self._holds_less(other, variant, size):
                        fails_at.setdefault((variant, knobs), []).append(size)
        probabilities = np.ones(len(indices))
        for (variant, knobs), present in self._index.present_by_group(indices).items():
            largest_ok, boundary = fits_at[variant], boundaries[variant]
            failed = fails_at.get((variant, knobs), ())
            smallest_oom = min((s for s in failed if s > largest_ok), default=None)
            for position, size in present:
                if size > largest_ok:
                    probabilities[position] = _beyond(size, largest_ok, smallest_oom, boundary)
        return probabilities

    def _holds_less(self, variant: Variant, other: Variant, size: int) -> bool:
        """Whether ``variant`` holds no more memory than ``other`` at micro-batch ``size``: by
        the estimates where there are (a stage's buffers can outweigh what it shards on a
        small model), else a higher stage up to 2 with the optimizer offloaded alike."""
        mine, theirs = self._estimate(variant), self._estimate(other)
        if mine is not None and theirs is not None:
            return mine.bytes_at(size) <= theirs.bytes_at(size)
        return (
            variant.offload_optimizer == other.offload_optimizer
            and other.stage < variant.stage <= 2
        )

    def _estimate(self, variant: Variant) -> MemoryEstimate | None:
        """The memory estimate of ``variant`` (None: none, or a variant the space no longer
        searches, measured before the model's size was known)."""
        plan = self._index.plans.get(variant)
        return plan.estimate if plan is not None else None

    def _boundary(
        self, variant: Variant, peaks: Mapping[Variant, list[tuple[int, int]]]
    ) -> tuple[float, float] | None:
        """Where the variant's memory ends, as the log of the largest micro-batch that fits
        and the uncertainty of that log: the estimate's line, moved through the peaks
        measured in the variant (its slope too, once two sizes were); without any, scaled by
        how far off the estimate was in the variants measured (the same activations, the
        same allocator); None without an estimate."""
        estimate = self._index.plans[variant].estimate
        if estimate is None:
            return None
        slope = float(max(1, estimate.activation_bytes_per_sample))
        own = sorted(peaks.get(variant, ()))
        if own:
            (low_size, low_peak), (high_size, high_peak) = own[0], own[-1]
            if high_size > low_size and high_peak > low_peak:
                slope = (high_peak - low_peak) / (high_size - low_size)
            largest = high_size + (estimate.budget_bytes - high_peak) / slope
            return math.log(max(largest, 0.5)), MEMORY_SD_CALIBRATED
        ratios = [
            peak / other_estimate.bytes_at(size)
            for other, measured in peaks.items()
            if (other_estimate := self._estimate(other)) is not None
            for size, peak in measured[-1:]
            if other_estimate.bytes_at(size) > 0
        ]
        scale, spread = 1.0, MEMORY_SD_ESTIMATED
        if ratios:
            scale, spread = sum(ratios) / len(ratios), MEMORY_SD_TRANSFERRED
        room = estimate.budget_bytes / scale - estimate.bytes_at(0)
        return math.log(max(room / slope, 0.5)), spread


def _beyond(size: int, fits: int, fails: int | None, boundary: tuple[float, float] | None) -> float:
    """The chance that the largest micro-batch that fits is at least ``size``, given that
    ``fits`` did and ``fails`` (None: nothing) did not: the boundary's prior (log-normal,
    ``boundary``: mean and standard deviation of its log) truncated to what ran; uniform
    between the two without a prior."""
    if fails is not None and size >= fails:
        return 0.0
    if boundary is None:
        return 1.0 if fails is None else (fails - size) / (fails - fits)
    center, spread = boundary

    def z(x: float) -> float:
        return -math.inf if x <= 0 else (math.log(x) - center) / spread

    top = math.inf if fails is None else z(fails)
    return _tail_share(z(size), z(fits), top)


def _tail_share(x: float, low: float, high: float) -> float:
    """P(X >= x | low <= X < high) for a standard normal X, stable far in either tail."""
    if x <= low:
        return 1.0
    if x >= high:
        return 0.0
    if low > 5.0:  # far in the upper tail: the ratio of the tails, asymptotically
        above = math.exp(-(x * x - low * low) / 2) * low / x
        cut = 0.0 if high == math.inf else math.exp(-(high * high - low * low) / 2) * low / high
        return max(0.0, (above - cut) / (1.0 - cut)) if cut < 1.0 else 0.0
    upper = 1.0 if high == math.inf else normal_cdf(high)
    mass = upper - normal_cdf(low)
    if mass <= 1e-12:
        return 0.0
    return max(0.0, upper - normal_cdf(x)) / mass
