"""What a tuning run found, as plain data the results package writes out, and how the
tuner's record of the run becomes it (:func:`summarize`)."""

from __future__ import annotations

import itertools
import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from autotune.config import AutotuningConfig, Metric
from autotune.experiment import ExperimentResult
from autotune.tuner.cost_model import CostModel
from autotune.tuner.ledger import Entry, Ledger
from autotune.tuner.ranking import TOLERANCE, Ranked, within_noise
from autotune.tuner.reasons import NotRunReason, StopReason
from autotune.tuner.remeasure import short_windows
from autotune.tuner.space import TuningSpace


@dataclass(frozen=True)
class AtCap:
    """The best runs at the largest micro-batch allowed: ``micro_batch_size``, the largest
    the user listed (``listed``) or the largest the batch limits allow."""

    micro_batch_size: int
    listed: bool


@dataclass(frozen=True)
class TuningSummary:
    """The outcome of a tuning run (or of the run so far).

    Attributes:
        metric: what was optimised.
        ranking: every configuration that ran ok, repeats folded, in the one order every
            output shows (:func:`~autotune.tuner.ranking.rank`: best median first).
        best: the first of ``ranking``.
        best_overrides: the dotted-key values that make the user's config the best one.
        best_per_variant: the best configuration of each ZeRO variant (``z2``, ``z3_ocpu``).
        top_two_within_noise: whether the first two of ``ranking`` are within the noise of
            each other (see :meth:`ties`; None with fewer than two).
        num_run: experiments that ran, re-measurements included.
        num_failed: experiments that ran and did not end ``ok``.
        not_run: configurations, variants and micro-batch ranges never run, each with the
            reason.
        failed: experiments that did not end ``ok``: ``"oom: ..."``, ``"error: ..."``.
        tuning_time_s: wall time, across resumed runs.
        stop: why the search ended (None: it has not, or it ran all it had).
        num_disturbed: measurements taken while other processes competed for the ranks'
            cores (see :mod:`autotune.profiling.interference`); a configuration ranks on the
            others where it has any.
        search_bound: the most experiments the run can make, re-measurements included (the
            trial cap).
        short_windows: configurations whose profile window lasted under the tuner's
            ``MIN_WINDOW_S``, with its median length in seconds: too short to rank on.
        window_steps: optimizer steps in the profile window.
        num_remeasured: of ``num_run``, the re-measurements (the rest searched the space).
        best_at_cap: where the best runs at the largest micro-batch its variant allows (and
            fitted), that size, and whether the user listed it: a larger one may be faster.
            runs at the largest the config allows (a larger one may be faster); else None.
        noise: the relative noise of one measurement, from the repeats (None: not known).
        noise_measured: whether the repeats showed it; False: nothing was measured twice,
            and ``noise`` is the prior guess (or what the windows' own steps vary by).
        num_stopped_early: search experiments stopped after their first timed steps, slower
            than the best by more than the tolerance allowed (their values are from those
            steps).
        cost_model: ``model_based``'s cost model as last fitted (its constants with their
            uncertainties, see :meth:`autotune.tuner.cost_model.CostModel.to_dict`).
        num_infrastructure_retries: experiments run again by the runner after a failure of
            the machinery, not of the configuration (a port taken, a rank lost before it began).
        waited_for_quiet_s: how long the run waited between experiments for a busy machine
            to quiet down (see :mod:`autotune.tuner.remeasure`); 0: it did not.
        not_run_counts: how many configurations each entry of ``not_run`` stands for (a
            whole variant, a micro-batch range; each counted once, under its most specific
            entry, and none that ran); an entry missing from it is one configuration.
    """

    metric: Metric
    ranking: tuple[Ranked, ...]
    best: Ranked | None
    best_overrides: Mapping[str, Any]
    best_per_variant: Mapping[str, Ranked]
    top_two_within_noise: bool | None
    num_run: int
    num_failed: int
    not_run: Mapping[str, NotRunReason] = field(default_factory=dict)
    failed: Mapping[str, str] = field(default_factory=dict)
    tuning_time_s: float = 0.0
    stop: StopReason | None = None
    num_disturbed: int = 0
    search_bound: int = 0
    short_windows: Mapping[str, float] = field(default_factory=dict)
    window_steps: int = 0
    num_remeasured: int = 0
    best_at_cap: AtCap | None = None
    noise: float | None = None
    noise_measured: bool = False
    num_stopped_early: int = 0
    cost_model: Mapping[str, Any] | None = None
    num_infrastructure_retries: int = 0
    not_run_counts: Mapping[str, int] = field(default_factory=dict)
    waited_for_quiet_s: float = 0.0

    @property
    def num_tied(self) -> int:
        """How many of the ranking's first configurations are within measurement noise of
        the best (see :func:`tied`): 1 when the best stands alone."""
        if self.best is None:
            return 0
        count = 1
        for ranked in self.ranking[1:]:
            if not tied(self.best, ranked, self.noise):
                break
            count += 1
        return count

    @property
    def disturbed_only(self) -> tuple[str, ...]:
        """Configurations ranked on disturbed measurements alone (their values too low)."""
        return tuple(r.name for r in self.ranking if r.disturbed)

    @property
    def num_not_run(self) -> int:
        """Configurations not run (a whole variant counts each of its micro-batch sizes)."""
        return sum(self.not_run_counts.get(name, 1) for name in self.not_run)


def summarize(
    ledger: Ledger,
    space: TuningSpace,
    tuning: AutotuningConfig,
    *,
    not_run: Mapping[str, NotRunReason],
    tuning_time_s: float,
    stop: StopReason | None,
    noise: float | None = None,
    noise_measured: bool = False,
    cost_model: CostModel | None = None,
    waited_for_quiet_s: float = 0.0,
) -> TuningSummary:
    """The summary of what ``ledger`` holds, searched over ``space`` under ``tuning``;
    ``not_run``: what was considered and not run, each with the reason."""
    metric = tuning.metric
    ranking = ledger.ranked(ledger.results.values(), metric)
    best = ranking[0] if ranking else None
    per_variant: dict[str, Ranked] = {}
    for entry in ranking:
        per_variant.setdefault(ledger.entries[entry.name].variant.label, entry)
    failed = {name: _failure_line(r) for name, r in ledger.results.items() if not r.ok}
    best_entry = ledger.entries[best.name] if best is not None else None
    return TuningSummary(
        metric=metric,
        ranking=tuple(ranking),
        best=best,
        best_overrides=dict(best_entry.overrides) if best_entry else {},
        best_per_variant=per_variant,
        top_two_within_noise=(tied(ranking[0], ranking[1], noise) if len(ranking) > 1 else None),
        num_run=len(ledger.results),
        num_failed=len(failed),
        not_run=not_run,
        failed=failed,
        tuning_time_s=tuning_time_s,
        stop=stop,
        num_disturbed=sum(
            1 for r in ledger.results.values() if r.metrics is not None and r.metrics.disturbed
        ),
        search_bound=tuning.tuner_num_trials,
        short_windows={
            name: seconds
            for name, seconds in short_windows(ledger).items()
            if name in ledger.entries
        },
        window_steps=tuning.end_profile_step - tuning.start_profile_step + 1,
        num_remeasured=sum(1 for n in ledger.results if ledger.is_repeat(n)),
        best_at_cap=_at_cap(best_entry, space),
        noise=noise,
        noise_measured=noise_measured,
        num_stopped_early=sum(
            1 for r in ledger.results.values() if r.stopped_after_steps is not None
        ),
        cost_model=cost_model.to_dict() if cost_model is not None else None,
        num_infrastructure_retries=sum(r.infrastructure_retries for r in ledger.results.values()),
        not_run_counts=not_run_counts(not_run, ledger, space),
        waited_for_quiet_s=waited_for_quiet_s,
    )


# The names of what did not run that stand for several configurations: ``z1 micro-batch >
# 64`` (sizes above a failure), ``micro-batch >= 16`` (the data bound, in every variant),
# ``z1: 12 configurations`` (model_based's unmeasured ones).
_SIZES_ABOVE = re.compile(r"(?P<label>\S+) micro-batch > (?P<size>\d+)")
_DATA_BOUND = re.compile(r"micro-batch >= (?P<size>\d+)")
_COUNTED = re.compile(r"(?P<label>\S+): (?P<count>\d+) configurations")

_Key = tuple[Any, ...]


def not_run_counts(
    not_run: Mapping[str, NotRunReason], ledger: Ledger, space: TuningSpace
) -> dict[str, int]:
    """How many configurations each entry of ``not_run`` stands for: each configuration
    (variant, micro-batch, knobs) once, under the most specific entry that names it (a
    configuration's own name, then a range of sizes, then its whole variant), and none that
    ran. A variant pruned before the search has every size the config allows."""
    plans = {plan.variant.label: plan for plan in space.plans}
    ran = {
        (entry.variant.label, entry.micro_batch_size, entry.knobs)
        for name, entry in ledger.entries.items()
        if name in ledger.results
    }

    def sizes_of(label: str, keep: Any = lambda size: True) -> Iterable[_Key]:
        plan = plans.get(label)
        sizes = plan.ladder if plan is not None else space.sizes
        return ((label, size, ()) for size in sizes if keep(size))

    def keys(name: str) -> Iterable[_Key]:
        entry = ledger.entries.get(name)
        if entry is not None:
            return [(entry.variant.label, entry.micro_batch_size, entry.knobs)]
        if name in plans or name in space.pruned:
            return sizes_of(name)
        if match := _SIZES_ABOVE.fullmatch(name):
            above = int(match["size"])
            return sizes_of(match["label"], lambda size: size > above)
        if match := _DATA_BOUND.fullmatch(name):
            least = int(match["size"])
            return itertools.chain.from_iterable(
                sizes_of(label, lambda size: size >= least) for label in plans
            )
        if match := _COUNTED.fullmatch(name):
            return [(name, i) for i in range(int(match["count"]))]
        return [(name,)]

    # The most specific first: a configuration's own name, then ranges, then whole variants.
    order = sorted(
        not_run, key=lambda n: (n not in ledger.entries, n in plans or n in space.pruned)
    )
    counted: set[_Key] = set(ran)
    counts = {}
    for name in order:
        mine = set(keys(name)) - counted
        counted |= mine
        counts[name] = len(mine)
    return counts


def _at_cap(best: Entry | None, space: TuningSpace) -> AtCap | None:
    """Where the best runs at the largest micro-batch its variant's sizes allow (and fitted):
    a larger one, never tried, may be faster."""
    plan = next((p for p in space.plans if best and p.variant == best.variant), None)
    if best is None or plan is None or best.micro_batch_size != plan.ladder[-1]:
        return None
    return AtCap(best.micro_batch_size, listed=not plan.halving)


def _failure_line(result: ExperimentResult) -> str:
    """``"oom: OutOfMemoryError: ..."``: the status, then the error unless it already says it."""
    status, error = result.status.value, result.error or ""
    return error if error.startswith(f"{status}:") else f"{status}: {error}" if error else status


def tied(best: Ranked, other: Ranked, noise: float | None) -> bool:
    """Whether ``other`` is within measurement noise of ``best``: their measured ranges
    overlap, or their medians are closer than the tolerance or than 1.64 times the noise of
    their difference (``noise``: relative, of one measurement).

    Example:
        >>> tied(Ranked("a", 100, (100,), 0), Ranked("b", 97, (97,), 0), 0.03)
        True
        >>> tied(Ranked("a", 100, (100,), 0), Ranked("b", 80, (80,), 0), 0.03)
        False
    """
    if within_noise(best, other):
        return True
    if best.value <= 0 or other.value <= 0:
        return False
    gap = abs(math.log(best.value) - math.log(other.value))
    spread = 0.0
    if noise is not None:
        spread = 1.64 * noise * math.sqrt(1 / best.num_measurements + 1 / other.num_measurements)
    return gap <= max(math.log(1 + TOLERANCE), spread)
