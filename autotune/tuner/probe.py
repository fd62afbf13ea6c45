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
from collections.abc import Mapping, Sequence

from autotune.experiment import ExperimentResult, Status
from autotune.tuner.ledger import Ledger
from autotune.tuner.space import VariantPlan

# Errors and timeouts the search for a variant's largest micro-batch steps over on the default
# ladder before it stops: they say nothing about memory, and a failure at every size above
# some point would otherwise be tried size by size. A list the user wrote runs whole.
MAX_FAILED_SIZES = 3


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


def failed_sizes_bound(plans: Sequence[VariantPlan], ledger: Ledger) -> dict[str, str]:
    """Where a default-ladder search stopped after :data:`MAX_FAILED_SIZES` errors and
    timeouts above its largest fit: the sizes above the first of them it never tried."""
    bounds = {}
    for plan in plans:
        fit = ledger.largest_fit(plan.variant)
        runs = ledger.runs_of(plan.variant)
        if not stepped_over_enough(plan, runs, fit):
            continue
        failed = sorted(
            s for s, r in runs.items() if fit is not None and s > fit and fails_alone(r)
        )
        untried = [s for s in plan.ladder if s > failed[0] and s not in runs]
        if not untried:
            continue
        bounds[f"{plan.variant.label} micro-batch > {failed[0]}"] = (
            f"not searched: {len(failed)} sizes above {fit} failed with an error or timeout "
            f"({', '.join(map(str, failed))}), which says nothing about memory; list the "
            "sizes in train_micro_batch_size_per_gpu to run them"
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
