"""The search for each ZeRO variant's largest micro-batch that fits.

Start at the memory estimate's largest fit; after a failure halve, after a fit climb (to
where the peak memory measured so far says memory ends, else the estimate without its
margin, else double) until a fit and a failure bracket it, then narrow the bracket (at the
measured-memory guess where it falls inside, else bisecting) to a fit and a failure one size
apart. Only an ``oom`` (or the script running out of data) bounds the search from above: an
``error`` or a ``timeout`` is a verdict on that size alone, which the search steps over.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from autotune.config import AutotuningConfig, TunerType
from autotune.experiment import ExperimentResult, Status
from autotune.tuner.bounds import Bounds
from autotune.tuner.catalog import Catalog
from autotune.tuner.history import History
from autotune.tuner.point_order import Subspace
from autotune.tuner.prior import best_micro_batch, variant_order
from autotune.tuner.ranking import score
from autotune.tuner.reasons import NotRunKind, NotRunReason, Unrun, UnrunKind
from autotune.tuner.space import VariantPlan

if TYPE_CHECKING:
    from autotune.profiling.model_info import ModelInfo

# Errors and timeouts the search for a variant's largest micro-batch steps over on the default
# ladder before it stops: they say nothing about memory, and a failure at every size above
# some point would otherwise be tried size by size. A list the user wrote runs whole.
MAX_FAILED_SIZES = 3
# Knob points model_based tries on its favourite variant before searching the others.
FAVOURITE_KNOBS = 8


def probe_size(
    plan: VariantPlan, runs: Mapping[int, ExperimentResult], data_bound: int | None
) -> int | None:
    """The next micro-batch in the search for the largest that fits ``plan``'s variant,
    given its ``runs`` so far (size → result) and the micro-batch where the script ran out
    of data (``data_bound``, None: nowhere).

    None once the largest fit is bracketed exactly (or nothing fits); on the default ladder,
    once :data:`MAX_FAILED_SIZES` sizes above the largest fit failed with an error or
    timeout, nothing above the first of them is searched (see :func:`failed_sizes_bound`); a
    list the user wrote runs whole.
    """
    fit = max((s for s, r in runs.items() if r.ok), default=None)
    floor = 0 if fit is None else fit
    ooms = [s for s, r in runs.items() if r.status is Status.oom and s > floor]
    bound = min((s for s in (*ooms, data_bound) if s is not None), default=None)
    # Sizes still open, split into gaps by the failures above the largest fit: the search
    # goes on in the lowest gap with an open size, between its two ends.
    failures = sorted(s for s, r in runs.items() if not r.ok and floor < s)
    ends = [fit, *(s for s in failures if bound is None or s < bound), bound]
    if stepped_over_enough(plan, runs, fit):
        ends = ends[:2]  # only below the first failure above the fit
    for low_end, high_end in itertools.pairwise(ends):
        gap = [
            s
            for s in plan.ladder
            if s not in runs
            and (low_end is None or s > low_end)
            and (high_end is None or s < high_end)
        ]
        if gap:
            return _probe_in(plan, runs, gap, low_end, high_end)
    return None  # bracketed: ``fit`` is the largest that fits


def stepped_over_enough(
    plan: VariantPlan, runs: Mapping[int, ExperimentResult], fit: int | None
) -> bool:
    """Whether the default ladder's search has met :data:`MAX_FAILED_SIZES` errors and
    timeouts above its largest fit, and so searches no further above them."""
    if not plan.halving or fit is None:
        return False
    return sum(1 for s, r in runs.items() if s > fit and fails_alone(r)) >= MAX_FAILED_SIZES


def _probe_in(
    plan: VariantPlan,
    runs: Mapping[int, ExperimentResult],
    gap: list[int],
    low_end: int | None,
    high_end: int | None,
) -> int:
    """The size to run in ``gap``, the open sizes between two ends: a fit or failure
    below (None: nothing below), a failure above (None: nothing above)."""
    if low_end is None:
        if high_end is None:  # nothing run yet: the start, or the largest size below it
            return max((s for s in gap if s <= plan.start), default=gap[0])
        # Halve below a failure, as far as the gap allows.
        return max((s for s in gap if s <= high_end // 2), default=gap[-1])
    guess = memory_guess(plan, runs)
    if guess is not None and (high_end is None or guess < high_end):
        # The guess, or the next size up when memory says the fit is the largest.
        return max((s for s in gap if s <= guess), default=gap[0])
    if high_end is None:  # climb: to the estimate without its margin, else doubling
        estimate = plan.ceiling
        target = estimate if estimate is not None and estimate > low_end else 2 * low_end
        return min((s for s in gap if s >= target), default=gap[-1])
    return gap[len(gap) // 2]


def failed_sizes_bound(plans: Sequence[VariantPlan], history: History) -> dict[Unrun, NotRunReason]:
    """Where a default-ladder search stopped after :data:`MAX_FAILED_SIZES` errors and
    timeouts above its largest fit: the sizes above the first of them it never tried."""
    bounds = {}
    for plan in plans:
        fit = history.largest_fit(plan.variant)
        runs = history.runs_of(plan.variant)
        if fit is None or not stepped_over_enough(plan, runs, fit):
            continue
        failed = sorted(s for s, r in runs.items() if s > fit and fails_alone(r))
        untried = [s for s in plan.ladder if s > failed[0] and s not in runs]
        if not untried:
            continue
        bounds[Unrun(UnrunKind.sizes_above, plan.variant.label, failed[0])] = NotRunReason(
            NotRunKind.failed_sizes, (len(failed), fit, ", ".join(map(str, failed)))
        )
    return bounds


def fails_alone(result: ExperimentResult) -> bool:
    """An ``error`` or ``timeout`` that is a verdict on its own configuration only: not an
    ``oom`` (memory grows with the micro-batch) nor a script that ran out of data."""
    return result.status in (Status.error, Status.timeout) and not result.ended_early


def memory_guess(plan: VariantPlan, runs: Mapping[int, ExperimentResult]) -> int | None:
    """The largest micro-batch that fits by the peak memory measured so far, or None.

    Memory grows linearly with the micro-batch: through the two largest fits' peaks, or from
    the largest with the estimate's activations per sample. Where the line is wrong the
    bracket still closes: a guess outside it is not used.
    """
    if plan.estimate is None:
        return None
    peaks = sorted(
        (size, r.metrics.peak_memory_bytes)
        for size, r in runs.items()
        if r.ok and r.metrics is not None and r.metrics.peak_memory_bytes > 0
    )
    if not peaks:
        return None
    size, peak = peaks[-1]
    slope: float = plan.estimate.activation_bytes_per_sample
    if len(peaks) > 1 and peaks[-1][1] > peaks[-2][1]:
        slope = (peaks[-1][1] - peaks[-2][1]) / (peaks[-1][0] - peaks[-2][0])
    if slope <= 0:
        return None
    return size + int((plan.estimate.budget_bytes - peak) // slope)


class SizeSearch:
    """The ``max_micro_batch`` phase's proposals: the next size of each variant's search, the
    variants in the order the tuner type puts them (:func:`~autotune.tuner.prior.variant_order`,
    set by :meth:`order`).

    Args:
        catalog: the configurations by name (the space searched now).
        history: what the study says of the run.
        bounds: what failures prune (the data bound ends every variant's search alike).
        tuning: the ``autotuning`` section (the tuner type, its seed).
        model_info: the model's sizes (None: not known yet), for the variants' order.
    """

    def __init__(
        self,
        catalog: Catalog,
        history: History,
        bounds: Bounds,
        tuning: AutotuningConfig,
        model_info: ModelInfo | None,
    ) -> None:
        self._catalog = catalog
        self._history = history
        self._bounds = bounds
        self._tuning = tuning
        self._plans = variant_order(catalog.space.plans, tuning.tuner_type, tuning.seed, model_info)

    def size(self, plan: VariantPlan) -> int | None:
        """The next micro-batch in the search for ``plan``'s largest fit (see
        :func:`probe_size`), None once it is bracketed."""
        runs = self._history.runs_of(plan.variant)
        return probe_size(plan, runs, self._bounds.data_ceiling_size())

    def next(self) -> str | None:
        """The next experiment of the search for each variant's largest micro-batch.

        Variants in order; one whose next size is in flight lets the next variant go
        meanwhile. ``model_based`` goes depth first: once a variant's largest fit is known it
        runs the sizes the micro-batch phase would compare for it before searching the next
        variant, so that the variant the prior favours is measured whole early.
        """
        depth_first = TunerType(self._tuning.tuner_type) is TunerType.model_based
        for plan in self._plans:
            size = self.size(plan)
            if size is not None:
                name = self._catalog.register(plan.variant, size, ())
                if self._history.is_free(name):
                    return name
                continue
            largest = self._history.largest_fit(plan.variant)
            if depth_first and largest is not None:
                for compared in plan.compared_sizes(largest):
                    name = self._catalog.register(plan.variant, compared, ())
                    if self._catalog.is_open(name):
                        return name
                favourite = self._favourite_knobs(plan) if plan is self._plans[0] else None
                if favourite is not None:
                    return favourite
        return None

    def _favourite_knobs(self, plan: VariantPlan) -> str | None:
        """For the variant the prior favours: a few of its knob points at its best micro-batch
        (seeded random order), before the other variants are searched."""
        size = best_micro_batch(plan, self._history, self._tuning)
        if size is None or not plan.knobs:
            return None
        points = Subspace(plan.variant.label, plan.knobs).points()
        random.Random(self._tuning.seed).shuffle(points)
        recommended = self._catalog.recommended(plan)
        if recommended is not None:  # what practice recommends goes first
            points.remove(recommended)
            points.insert(0, recommended)
        register = self._catalog.register
        names = [register(plan.variant, size, p.values) for p in points[:FAVOURITE_KNOBS]]
        # Early stopping holds here too: no better than the variant's micro-batch runs after
        # ``tuner_early_stopping`` of them (in flight counting as no better) ends the burst.
        metric = self._tuning.metric
        before = [r for r in self._history.runs_of(plan.variant).values() if r.ok]
        best = max((score(r.metrics, metric) for r in before if r.metrics), default=None)
        tried = [n for n in names if not self._history.is_free(n)]
        improved = any(
            (r := self._history.results.get(n)) is not None
            and r.ok
            and r.metrics is not None
            and (best is None or score(r.metrics, metric) > best)
            for n in tried
        )
        if not improved and len(tried) >= self._tuning.tuner_early_stopping:
            return None
        return next((n for n in names if self._catalog.is_open(n)), None)
