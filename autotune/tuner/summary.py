"""What a tuning run found, as plain data the results package writes out, and how the
tuner's record of the run becomes it (:func:`summarize`)."""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from autotune.config import Metric
from autotune.experiment import ExperimentResult
from autotune.tuner.cost_model import CostModel
from autotune.tuner.history import Entry, History
from autotune.tuner.noise import short_windows
from autotune.tuner.probe import failed_sizes_bound
from autotune.tuner.ranking import TOLERANCE, Ranked, within_noise
from autotune.tuner.reasons import NotRunKind, NotRunReason, StopKind, StopReason, Unrun, UnrunKind
from autotune.tuner.space import TuningSpace

if TYPE_CHECKING:
    from autotune.tuner.record import RunRecord
    from autotune.tuner.search import Search, SearchContext


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
    not_run: Mapping[Unrun, NotRunReason] = field(default_factory=dict)
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
    not_run_counts: Mapping[Unrun, int] = field(default_factory=dict)
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

    def not_run_names(self) -> set[str]:
        """The names of what was not run: configurations' and variants' (``z3``)."""
        return {
            unrun.name for unrun in self.not_run if unrun.kind.value in ("configuration", "variant")
        }

    @property
    def num_not_run(self) -> int:
        """Configurations not run (a whole variant counts each of its micro-batch sizes)."""
        return sum(self.not_run_counts.get(name, 1) for name in self.not_run)


def summarize(
    context: SearchContext,
    run: RunRecord,
    search: Search,
    *,
    finished: bool,
    tuning_time_s: float,
    noise: tuple[float, bool] | None = None,
    cost_model: CostModel | None = None,
) -> TuningSummary:
    """The summary of the run the study records: ``context`` (the search's walk on it),
    ``run`` (what the driver recorded beside it), ``search`` (the tuner type's); ``noise``:
    the relative noise of one measurement, and whether the run measured it."""
    history, space, tuning = context.history, context.space, context.tuning
    metric = tuning.metric
    ranking = history.ranking(metric)
    best = ranking[0] if ranking else None
    per_variant: dict[str, Ranked] = {}
    for entry in ranking:
        per_variant.setdefault(history.entries[entry.name].variant.label, entry)
    failed = {name: _failure_line(r) for name, r in history.results.items() if not r.ok}
    best_entry = history.entries[best.name] if best is not None else None
    stop = run.stop if run.search_ended else context.trace.reason
    if stop is None and finished:
        stop = StopReason(StopKind.exhausted)
    not_run = not_run_of(context, run, search, finished)
    noise_value, noise_measured = noise if noise is not None else (None, False)
    return TuningSummary(
        metric=metric,
        ranking=tuple(ranking),
        best=best,
        best_overrides=dict(best_entry.overrides) if best_entry else {},
        best_per_variant=per_variant,
        top_two_within_noise=(
            tied(ranking[0], ranking[1], noise_value) if len(ranking) > 1 else None
        ),
        num_run=len(history.results),
        num_failed=len(failed),
        not_run=not_run,
        failed=failed,
        tuning_time_s=tuning_time_s,
        stop=stop,
        num_disturbed=sum(
            1 for r in history.results.values() if r.metrics is not None and r.metrics.disturbed
        ),
        search_bound=tuning.tuner_num_trials,
        short_windows={
            name: seconds
            for name, seconds in short_windows(history).items()
            if name in history.entries
        },
        window_steps=tuning.end_profile_step - tuning.start_profile_step + 1,
        num_remeasured=sum(1 for n in history.results if history.is_repeat(n)),
        best_at_cap=_at_cap(best_entry, space),
        noise=noise_value,
        noise_measured=noise_measured,
        num_stopped_early=sum(
            1 for r in history.results.values() if r.stopped_after_steps is not None
        ),
        cost_model=cost_model.to_dict() if cost_model is not None else None,
        num_infrastructure_retries=sum(r.infrastructure_retries for r in history.results.values()),
        not_run_counts=not_run_counts(not_run, history, space),
        waited_for_quiet_s=sum(wait.waited_s for wait in run.waits),
    )


def not_run_of(
    context: SearchContext, run: RunRecord, search: Search, finished: bool
) -> dict[Unrun, NotRunReason]:
    """Every variant, range and configuration the run considered and did not run, with the
    reason: pruned (the memory estimate, a config rule, an ``oom`` below it, the data bound,
    errors above the largest fit), not reached (its phase or the search ended first, and
    why; the time budget), or, once over, left by the search (``model_based``'s, one entry
    per variant)."""
    history, trace = context.history, context.trace
    if run.search_ended:  # ended by a limit of the run's, maybe before its phase noted them
        context.note_unsearched_variants()
    explained: dict[Unrun, NotRunReason] = {
        Unrun.variant(label): why for label, why in trace.variants.items()
    }
    for name, rule in context.catalog.rejected.items():
        explained[Unrun.configuration(name)] = NotRunReason(NotRunKind.config_rule, (rule,))
    explained.update(failed_sizes_bound(context.space.plans, history))
    explained.update(context.bounds.pruned())
    reached: dict[str, NotRunReason] = {}
    for _, points, reason in trace.ended:
        for name in points:
            reached.setdefault(name, NotRunReason(NotRunKind.not_reached, stop=reason))
    if run.search_ended and trace.current is not None:
        for name in trace.current[1]:
            reached.setdefault(name, NotRunReason(NotRunKind.not_reached, stop=run.search_stop))
    if run.left is not None and history.is_free(run.left):
        stop = run.run_stop if run.run_ended and run.run_stop else run.search_stop
        explained[Unrun.configuration(run.left)] = NotRunReason(NotRunKind.time_budget, stop=stop)
    ended = NotRunReason(NotRunKind.search_ended, stop=run.stop)
    for name, entry in history.entries.items():
        key = Unrun.configuration(name)
        if history.is_free(name) and key not in explained:
            explained[key] = reached.get(name) or trace.variants.get(entry.variant.label, ended)
    if finished:
        for label, count in search.not_measured(context).items():
            if Unrun.variant(label) not in explained:
                explained[Unrun(UnrunKind.unmeasured, label, count=count)] = NotRunReason(
                    NotRunKind.not_measured, stop=run.stop
                )
    return explained


_Key = tuple[Any, ...]


def not_run_counts(
    not_run: Mapping[Unrun, NotRunReason], history: History, space: TuningSpace
) -> dict[Unrun, int]:
    """How many configurations each entry of ``not_run`` stands for: each configuration
    (variant, micro-batch, knobs) once, under the most specific entry that names it (a
    configuration, then a range of sizes, then its whole variant), and none that ran. A
    variant pruned before the search has every size the config allows."""
    plans = {plan.variant.label: plan for plan in space.plans}

    def key(entry: Entry) -> _Key:
        return (entry.variant.label, entry.micro_batch_size, () if entry.own_knobs else entry.knobs)

    ran = {key(entry) for name, entry in history.entries.items() if name in history.results}

    def sizes_of(label: str, keep: Any = lambda size: True) -> Iterable[_Key]:
        plan = plans.get(label)
        sizes = plan.ladder if plan is not None else space.sizes
        return ((label, size, ()) for size in sizes if keep(size))

    def keys(unrun: Unrun) -> Iterable[_Key]:
        if unrun.kind is UnrunKind.configuration:
            entry = history.entries.get(unrun.name)
            return [key(entry)] if entry is not None else [(unrun.name,)]
        if unrun.kind is UnrunKind.variant:
            return sizes_of(unrun.name)
        if unrun.kind is UnrunKind.sizes_above:
            return sizes_of(unrun.name, lambda size: size > unrun.size)
        if unrun.kind is UnrunKind.sizes_from:
            return itertools.chain.from_iterable(
                sizes_of(label, lambda size: size >= unrun.size) for label in plans
            )
        return [(unrun.name, "unmeasured", i) for i in range(unrun.count)]

    # The most specific first: a configuration, then ranges, then whole variants.
    order = sorted(
        not_run,
        key=lambda u: (u.kind is not UnrunKind.configuration, u.kind is UnrunKind.variant),
    )
    counted: set[_Key] = set(ran)
    counts = {}
    for unrun in order:
        mine = set(keys(unrun)) - counted
        counted |= mine
        counts[unrun] = len(mine)
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
