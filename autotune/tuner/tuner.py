"""The tuner: decides what to run next and when to stop, behind ask/tell. It runs nothing.

The flow (DeepSpeed's, with its bugs fixed), one phase after another:

1. ``max_micro_batch``: per ZeRO variant, find the largest micro-batch that fits, exactly:
   start at the memory estimate's largest fit; after a failure halve, after a fit climb (to
   where the peak memory measured so far says memory ends, else the estimate without its
   margin, else double) until a fit and a failure bracket it, then narrow the bracket (at the
   measured-memory guess where it falls inside, else bisecting) to a fit and a failure one
   size apart. An ``oom`` is a constraint: every larger micro-batch with the same stage
   and knobs is pruned unrun. A script that ran out of data (it ended early,
   :attr:`ExperimentResult.ended_early`: its loader has fewer batches at that micro-batch than
   the profile window needs) bounds every variant alike: that micro-batch and every larger one
   are pruned everywhere. A script that ends after as many steps whatever the micro-batch has
   a step limit of its own, which no config changes: the run ends saying so. Variants are
   searched one after another, in an order the tuner type decides (see
   :func:`~autotune.tuner.prior.variant_order`).
2. ``micro_batch``: compare the largest fit and sizes about half apart below it
   (``num_tuning_micro_batch_sizes`` in all), per variant, with the chosen sampler.
   ``fast: true`` (and no knob lists) stops the search here.
3. ``knobs``: each surviving variant at its best micro-batch, over its knobs.
4. ``remeasure``: the top ``num_remeasure`` configurations run again (``<name>_r1``, ...) and
   the best is declared on the median of repeats — step times vary up to ±50% run to run.

Phases 2 and 3 end early after ``tuner_early_stopping`` experiments without a new best;
the whole run ends once the first :data:`SAME_FAILURE_LIMIT` experiments all failed with the
same error (a script that rejects a flag fails alike whatever the config);
``tuner_num_trials`` caps the search experiments (re-measurements are extra).
``time_budget_s`` bounds the run's wall time: an experiment starts only if it is expected to
end within it (:mod:`autotune.tuner.budget`), and the search ends where its next experiment
would leave no room to re-measure the best so far.

Several experiments may be in flight at once. ``ask`` then returns None both when the search
is over and when the next proposal needs a result first (the end of a phase, the next step of
a micro-batch descent, early stopping that in-flight results may still settle): ``finished``
tells the two apart. The trial cap and early stopping count experiments in flight, so a run
with several at once proposes exactly what a one-at-a-time run would (given the same results).

Every decision is derived from the results told so far, so a resumed run re-seeds the tuner by
telling it the results log before asking (names identify configurations), in the order the
experiments were proposed, with those left unfinished owed in their places (:meth:`Tuner.owe`).

A script's model is unknown until an experiment measures it: :meth:`Tuner.learn_model` then
brings in the memory estimate for what is not yet decided, keeping everything run, running or
owed (ranked even where the estimate would now prune it). A tuner that knew the model from the
start, told the same results, decides alike, so a resumed script run needs no replay of when
the model was learnt.
"""

from __future__ import annotations

import enum
import itertools
import math
import random
import re
import statistics
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from autotune.config import Config, ConfigError, TunerType
from autotune.config.knobs import MICRO_BATCH_KEY, STAGE_KEY
from autotune.experiment import ExperimentResult, Status, wall_time_s
from autotune.tuner.budget import predicted_duration_s
from autotune.tuner.naming import repeat_name, split_repeat
from autotune.tuner.prior import largest_micro_batch_stands, variant_order
from autotune.tuner.ranking import (
    Ranked,
    could_be_better,
    declared_order,
    race_can_settle,
    rank,
    relative_noise,
    score,
    within_noise,
)
from autotune.tuner.samplers import Point, Sampler, Subspace, make_sampler
from autotune.tuner.space import (
    TuningSpace,
    Variant,
    VariantPlan,
    build_space,
    recommended_point,
)
from autotune.tuner.summary import TuningSummary

if TYPE_CHECKING:
    from autotune.profiling.model_info import ModelInfo


class Phase(str, enum.Enum):
    """Where the tuner is; see the module docstring."""

    max_micro_batch = "max_micro_batch"
    micro_batch = "micro_batch"
    knobs = "knobs"
    remeasure = "remeasure"
    done = "done"


_PHASES = list(Phase)
# Re-measured configurations in all, as a multiple of num_remeasure (see _extend_remeasure).
MAX_REMEASURE_FACTOR = 2
# The race among the re-measured (see Tuner._race): rounds beyond the fixed repeats, how sure
# a drop-out must be (one-sided z), and the gap below which configurations count as tied.
MAX_RACE_ROUNDS = 4
RACE_CONFIDENCE_Z = 1.64
RACE_TOLERANCE = 0.02
# A profile window shorter than this measures the machine's jitter (on 2 CPU cores, windows
# of 0.1 s varied by 36-162% run to run): such configurations are re-measured as usual but
# never raced or let in by the noise, and the summary says to lengthen the window.
MIN_WINDOW_S = 0.5


# Knob points model_based tries on its favourite variant before searching the others.
FAVOURITE_KNOBS = 8
# Experiments that all failed with the same error, and none ok, that end the run: a failure
# that does not depend on the config would fail every remaining experiment too.
SAME_FAILURE_LIMIT = 3
# Errors and timeouts the search for a variant's largest micro-batch steps over on the default
# ladder before it stops: they say nothing about memory, and a failure at every size above
# some point would otherwise be tried size by size. A list the user wrote runs whole.
MAX_FAILED_SIZES = 3


@dataclass(frozen=True)
class Candidate:
    """An experiment the tuner wants run.

    Attributes:
        name: unique and stable across runs; the experiment's folder name.
        overrides: the dotted-key values applied to the user's config.
        ds_config: the concrete config to run (batch triad resolved, ``autotuning`` removed).
        phase: the phase that proposed it.
        repeat_of: for a re-measurement, the name of the original.
    """

    name: str
    overrides: Mapping[str, Any]
    ds_config: Mapping[str, Any]
    phase: Phase
    repeat_of: str | None = None

    @property
    def stage(self) -> int:
        return int(self.overrides[STAGE_KEY])

    @property
    def micro_batch_size(self) -> int:
        return int(self.overrides[MICRO_BATCH_KEY])


@dataclass(frozen=True)
class _Entry:
    """A configuration the tuner may propose, known by its name."""

    variant: Variant
    micro_batch_size: int
    knobs: tuple[tuple[str, Any], ...]
    overrides: Mapping[str, Any]


class Tuner:
    """Proposes experiments one at a time and learns from their results.

    Args:
        config: the user's config, search lists and ``autotuning`` section included.
        model_info: the workload's sizes, for the memory estimate (optional).
        device_memory_bytes: per-rank device budget (default: ``config.device_memory_bytes``);
            without it and ``model_info``, stages are pruned only by running out of memory.
        storage: an Optuna storage URL (``sqlite:///<results_dir>/study.db``) so that a
            ``model_based`` study outlives the process; None keeps it in memory.
        clock: seconds, monotonic; injectable for tests.
        started: the ``clock`` reading ``time_budget_s`` counts from (the command's start);
            None: now.
        num_repeats: re-measurements of each top configuration.

    Raises:
        ConfigError: if the batch limits leave no micro-batch size.

    Example:
        >>> from autotune.config import load_config
        >>> tuner = Tuner(load_config({"zero_optimization": {"stage": 1}}, world_size=2))
        >>> candidate = tuner.ask()
        >>> candidate.name, candidate.phase.value
        ('z1_mbs1024', 'max_micro_batch')

        A driver runs it and tells the result, until ``ask`` returns None with nothing in
        flight::

            while (candidate := tuner.ask()) is not None:
                tuner.tell(runner.run(spec_for(candidate)))
            summary, best = tuner.summary(), tuner.optimal_config()

        To resume, tell the results log first: ``for r in log: tuner.tell(r)``.
    """

    def __init__(
        self,
        config: Config,
        model_info: ModelInfo | None = None,
        *,
        device_memory_bytes: int | None = None,
        storage: str | None = None,
        clock: Callable[[], float] = time.monotonic,
        started: float | None = None,
        num_repeats: int = 2,
    ) -> None:
        self._config = config
        self._tuning = config.autotuning
        self._storage = storage
        self._num_repeats = num_repeats
        if device_memory_bytes is None:
            device_memory_bytes = config.device_memory_bytes
        self._device_memory_bytes = device_memory_bytes
        self._model_info = model_info
        self._pruned: dict[str, str] = {}
        self._entries: dict[str, _Entry] = {}
        self._results: dict[str, ExperimentResult] = {}
        self._order: list[str] = []  # names in the order they were told
        self._proposed: list[str] = []  # names in the order they were asked (or replayed)
        self._owed: set[str] = set()  # proposed by an interrupted run, never finished
        self._pending: dict[str, Candidate] = {}
        self._oom_floor: dict[tuple[Variant, tuple[tuple[str, Any], ...]], str] = {}
        # Micro-batch → the first run at it whose script ran out of data, and the sizes that
        # ran ok in any variant: together the bound on every variant (see _data_ceiling).
        self._out_of_data: dict[int, str] = {}
        self._ok_sizes: set[int] = set()
        self._phase = Phase.max_micro_batch
        self._sampler: Sampler | None = None
        self._phase_points: dict[str, Point] = {}  # name → point, for the sampler's phase
        self._point_names: dict[Point, str] = {}
        self._repeats: list[str] = []
        self._max_remeasured = 0  # configurations re-measured at most (see _start_remeasure)
        self._stop_reason = ""
        self._ended: dict[str, str] = {}  # name → why its phase ended before it ran
        self._clock = clock
        self._started = clock() if started is None else started
        self._first_asked: float | None = None  # when the first candidate went out
        self._replayed: list[ExperimentResult] = []
        # Micro-batch runs at the config's own knobs, per variant: size → result.
        self._size_runs: dict[Variant, dict[int, ExperimentResult]] = {}
        # Every such run's name, of any variant searched with or without the model's size.
        self._size_names: dict[str, tuple[Variant, int]] = {}
        self._use_space(build_space(config, model_info, device_memory_bytes))
        if model_info is not None and self._space.pruned:
            # What a run that did not know the model yet may have tried (a script's first
            # experiments), so that their results, told from history, are ranked too.
            self._add_size_names(build_space(config, None, device_memory_bytes))

    # --- the interface ------------------------------------------------------------------------

    @property
    def phase(self) -> Phase:
        return self._phase

    @property
    def finished(self) -> bool:
        """True when nothing more will be proposed and nothing is in flight."""
        return self._phase is Phase.done and not self._pending

    @property
    def elapsed_s(self) -> float:
        """Tuning time: this process's, plus the wall time replayed results took (their
        overlapping intervals counted once)."""
        return self._clock() - self._started + wall_time_s(self._replayed)

    def ask(self) -> Candidate | None:
        """The next experiment to run, or None: finished, or waiting for results in flight.

        Several candidates may be in flight at once; a phase ends only once all its results
        are in, so None with candidates pending means "tell me something first".
        """
        budget = self._tuning.time_budget_s
        if budget is not None and self.elapsed_s >= budget and self._phase is not Phase.done:
            self._finish(f"{self._time_budget_reason()} spent")
        if self._phase is not Phase.done and (error := self._same_failure()) is not None:
            self._finish(
                f"the first {SAME_FAILURE_LIMIT} experiments all failed with the same error "
                f"(numbers aside), so every other would too: {error}"
            )
        if self._phase is not Phase.done and (steps := self._step_limit()) is not None:
            window = self._tuning.end_profile_step
            self._finish(
                f"the script ends after {steps} optimizer steps whatever the micro-batch (a "
                f"limit of its own, such as --max_steps, not its data), before "
                f"end_profile_step ({window}): give it more steps or lower "
                "autotuning.end_profile_step"
            )
        while self._phase is not Phase.done:
            name = self._next_name()
            if name is None:
                if self._pending:
                    return None
                self._advance()
                continue
            candidate = self._candidate(name)
            if candidate is not None and not self._fits_time_budget(name):
                self._end_search_for_time(name)
                continue
            if candidate is not None:
                if self._first_asked is None:
                    self._first_asked = self._clock()
                self._pending[name] = candidate
                if name in self._owed:  # keeps the place it was first proposed at
                    self._owed.discard(name)
                else:
                    self._proposed.append(name)
                return candidate
        return None

    def learn_model(self, model_info: ModelInfo) -> None:
        """Learn the model's size mid-run (a script's, measured by its first experiment).

        The memory estimate then prunes variants, and moves where each variant's search for
        its largest micro-batch goes next and the order variants are searched in; the knob
        grids follow the model's size. Every result, pending and owed experiment is kept, and
        ranked whatever the estimate now says: what ran is measured, the estimate is a guess.
        Phases already started keep their candidates. A tuner that knew the model from the
        start and was told the same results decides alike (a resumed run). Only the first
        call counts.
        """
        if self._model_info is not None:
            return
        self._model_info = model_info
        self._use_space(build_space(self._config, model_info, self._device_memory_bytes))

    def owe(self, name: str) -> None:
        """Replay an experiment an interrupted run proposed but never finished, in its place
        among the replayed results (call in the order they were proposed).

        Until it is run again it counts as in flight for early stopping, and its phase
        proposes it before anything new, so the resumed run decides as the interrupted one
        would have.
        """
        if name not in self._results and name not in self._proposed:
            self._proposed.append(name)
            self._owed.add(name)

    def tell(self, result: ExperimentResult) -> None:
        """Record a finished experiment of any status.

        A result the tuner did not ask for is history being replayed: it is recorded the same
        way, and its duration counts toward the time budget. Telling a name twice keeps the
        first result.
        """
        if result.name in self._results:
            return
        if self._pending.pop(result.name, None) is None:
            self._replayed.append(result)
            if result.name in self._owed:
                self._owed.discard(result.name)
            else:
                self._proposed.append(result.name)
        self._results[result.name] = result
        self._order.append(result.name)
        entry = self._entry(result.name)
        if entry is not None and not entry.knobs:
            self._size_runs.setdefault(entry.variant, {})[entry.micro_batch_size] = result
        self._note_oom(result.name)
        self._note_micro_batch(result.name)
        point = self._phase_points.get(result.name)
        if point is not None and self._sampler is not None:
            self._tell_sampler(point, result)

    def summary(self) -> TuningSummary:
        """What the run found so far (complete once ``finished``)."""
        metric = self._tuning.metric
        ranked = [r for r in rank(self._results.values(), metric) if r.name in self._entries]
        ranking = declared_order(ranked)
        best = ranking[0] if ranking else None
        per_variant: dict[str, Ranked] = {}
        for entry in ranking:
            per_variant.setdefault(self._entries[entry.name].variant.label, entry)
        failed = {name: _failure_line(r) for name, r in self._results.items() if not r.ok}
        return TuningSummary(
            metric=metric,
            ranking=tuple(ranking),
            best=best,
            best_overrides=dict(self._entries[best.name].overrides) if best else {},
            best_per_variant=per_variant,
            top_two_within_noise=(
                within_noise(ranking[0], ranking[1]) if len(ranking) > 1 else None
            ),
            num_run=len(self._results),
            num_failed=len(failed),
            pruned=self._not_run(),
            failed=failed,
            tuning_time_s=self.elapsed_s,
            stop_reason=self._stop_reason,
            num_disturbed=sum(
                1 for r in self._results.values() if r.metrics is not None and r.metrics.disturbed
            ),
            search_bound=self._search_bound(),
            short_windows={
                name: seconds
                for name, seconds in self._short_windows().items()
                if name in self._entries
            },
            window_steps=self._tuning.end_profile_step - self._tuning.start_profile_step + 1,
            num_remeasured=sum(1 for n in self._results if split_repeat(n)[1] > 0),
            best_at_cap=self._at_cap(best),
        )

    def _at_cap(self, best: Ranked | None) -> str | None:
        """Why no larger micro-batch than the best's was tried, where the best runs at the
        largest its variant's sizes allow (and fitted): a larger one may be faster."""
        entry = self._entries.get(best.name) if best is not None else None
        plan = next((p for p in self._space.plans if entry and p.variant == entry.variant), None)
        if entry is None or plan is None or entry.micro_batch_size != plan.ladder[-1]:
            return None
        where = (
            "the largest listed in train_micro_batch_size_per_gpu"
            if not plan.halving
            else "the largest the batch limits allow (autotuning."
            "max_train_micro_batch_size_per_gpu, max_train_batch_size)"
        )
        return (
            f"the best runs at micro-batch {entry.micro_batch_size}, {where}, and fitted: a "
            "larger one may be faster"
        )

    def _search_bound(self) -> int:
        """``tuner_num_trials``, or fewer where the space holds fewer: every size of each
        variant's ladder, then its knob points at one micro-batch."""
        space = sum(
            len(plan.ladder) + (math.prod(len(v) for _, v in plan.knobs) if plan.knobs else 0)
            for plan in self._space.plans
        )
        return min(self._tuning.tuner_num_trials, space)

    def optimal_config(self) -> dict[str, Any] | None:
        """The user's config with the best values, ``autotuning`` removed, batch triad resolved.

        None when no experiment ran ok.
        """
        best = self.summary().best
        if best is None:
            return None
        return self._ds_config(self._entries[best.name].overrides)

    # --- choosing the next experiment ---------------------------------------------------------

    def _next_name(self) -> str | None:
        """The next name the current phase wants run, or None if it has nothing now."""
        if self._phase is Phase.remeasure:
            name = self._next_repeat()
            if name is None and not self._pending and self._extend_remeasure():
                name = self._next_repeat()
            return name
        if self._search_budget_spent():
            return None
        if self._phase is Phase.max_micro_batch:
            return self._next_owed_probe() or self._next_probe()
        if self._sampler is None:  # nothing to tune in this phase
            return None
        # What an interrupted run had running comes first, as it would have finished first.
        owed = (n for n in self._proposed if n in self._owed and n in self._phase_points)
        name = next((n for n in owed if self._is_free(n)), None)
        if name is not None:
            return name
        if self._patience_spent():  # until a result in flight brings a new best, if one does
            return None
        point = self._sampler.ask(lambda p: self._is_open(self._point_names[p]))
        return self._point_names[point] if point is not None else None

    def _next_probe(self) -> str | None:
        """The next experiment of the search for each variant's largest micro-batch.

        Variants in ``_probe_plans`` order; one whose next size is in flight lets the next
        variant go meanwhile. ``model_based`` goes depth first: once a variant's largest fit is
        known it runs the sizes the micro-batch phase would compare for it before searching
        the next variant, so that the variant the prior favours is measured whole early.
        """
        depth_first = TunerType(self._tuning.tuner_type) is TunerType.model_based
        for plan in self._probe_plans:
            size = self._probe_size(plan)
            if size is not None:
                name = self._register(plan.variant, size, ())
                if self._is_free(name):
                    return name
                continue
            largest = self._largest_fit(plan.variant)
            if depth_first and largest is not None:
                for compared in plan.compared_sizes(largest):
                    name = self._register(plan.variant, compared, ())
                    if self._is_open(name):
                        return name
                favourite = self._favourite_knobs(plan) if plan is self._probe_plans[0] else None
                if favourite is not None:
                    return favourite
        return None

    def _next_owed_probe(self) -> str | None:
        """A micro-batch probe an interrupted run had in flight, where the search it belongs
        to is still open: it goes first, as it would have finished first, even if the plan
        changed since it was proposed (the model's size learnt meanwhile)."""
        plans = {plan.variant: plan for plan in self._space.plans}
        for name in self._proposed:
            if name not in self._owed or name not in self._size_names or not self._is_free(name):
                continue
            plan = plans.get(self._size_names[name][0])
            if plan is None or self._probe_size(plan) is not None:
                self._entry(name)
                return name
        return None

    def _favourite_knobs(self, plan: VariantPlan) -> str | None:
        """For the variant the prior favours: a few of its knob points at its best micro-batch
        (seeded random order), before the other variants are searched."""
        size = self._best_micro_batch(plan)
        if size is None or not plan.knobs:
            return None
        points = Subspace(plan.variant.label, plan.knobs).points()
        random.Random(self._tuning.seed).shuffle(points)
        recommended = self._recommended(plan)
        if recommended is not None:  # what practice recommends goes first
            points.remove(recommended)
            points.insert(0, recommended)
        names = [self._register(plan.variant, size, p.values) for p in points[:FAVOURITE_KNOBS]]
        # Early stopping holds here too: no better than the variant's micro-batch runs after
        # ``tuner_early_stopping`` of them (in flight counting as no better) ends the burst.
        before = [r for r in self._size_runs.get(plan.variant, {}).values() if r.ok]
        best = max(
            (score(r.metrics, self._tuning.metric) for r in before if r.metrics), default=None
        )
        tried = [n for n in names if not self._is_free(n)]
        improved = any(
            (r := self._results.get(n)) is not None
            and r.ok
            and r.metrics is not None
            and (best is None or score(r.metrics, self._tuning.metric) > best)
            for n in tried
        )
        if not improved and len(tried) >= self._tuning.tuner_early_stopping:
            return None
        return next((n for n in names if self._is_open(n)), None)

    def _recommended(self, plan: VariantPlan) -> Point | None:
        """The knob point practice recommends for ``plan`` (see :func:`recommended_point`)."""
        values = recommended_point(plan.knobs, self._space.base)
        return None if values is None else Point(plan.variant.label, values)

    def _probe_size(self, plan: VariantPlan) -> int | None:
        """The next micro-batch in the search for the largest that fits ``plan``'s variant.

        Only an ``oom`` (or the script running out of data) bounds the search from above: an
        ``error`` or a ``timeout`` is a verdict on that size alone, which the search steps
        over. None once the largest fit is bracketed exactly (or nothing fits); on the default
        ladder, once :data:`MAX_FAILED_SIZES` sizes above the largest fit failed that way,
        nothing above the first of them is searched (see :meth:`_failed_sizes_bound`); a list
        the user wrote runs whole.
        """
        runs = self._size_runs.get(plan.variant, {})
        fit = max((s for s, r in runs.items() if r.ok), default=None)
        floor = 0 if fit is None else fit
        ooms = [s for s, r in runs.items() if r.status is Status.oom and s > floor]
        bound = min((s for s in (*ooms, self._data_ceiling_size()) if s is not None), default=None)
        # Sizes still open, split into gaps by the failures above the largest fit: the search
        # goes on in the lowest gap with an open size, between its two ends.
        failures = sorted(s for s, r in runs.items() if not r.ok and floor < s)
        ends = [fit, *(s for s in failures if bound is None or s < bound), bound]
        if self._stepped_over_enough(plan, fit):
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
                return self._probe_in(plan, runs, gap, low_end, high_end)
        return None  # bracketed: ``fit`` is the largest that fits

    def _stepped_over_enough(self, plan: VariantPlan, fit: int | None) -> bool:
        """Whether the default ladder's search has met :data:`MAX_FAILED_SIZES` errors and
        timeouts above its largest fit, and so searches no further above them."""
        runs = self._size_runs.get(plan.variant, {})
        if not plan.halving or fit is None:
            return False
        return sum(1 for s, r in runs.items() if s > fit and fails_alone(r)) >= MAX_FAILED_SIZES

    def _probe_in(
        self,
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
        guess = _memory_guess(plan, runs)
        if guess is not None and (high_end is None or guess < high_end):
            # The guess, or the next size up when memory says the fit is the largest.
            return max((s for s in gap if s <= guess), default=gap[0])
        if high_end is None:  # climb: to the estimate without its margin, else doubling
            estimate = plan.ceiling
            target = estimate if estimate is not None and estimate > low_end else 2 * low_end
            return min((s for s in gap if s >= target), default=gap[-1])
        return gap[len(gap) // 2]

    def _failed_sizes_bound(self) -> dict[str, str]:
        """Where a default-ladder search stopped after :data:`MAX_FAILED_SIZES` errors and
        timeouts above its largest fit: the sizes above the first of them it never tried."""
        bounds = {}
        for plan in self._space.plans:
            fit = self._largest_fit(plan.variant)
            if not self._stepped_over_enough(plan, fit):
                continue
            runs = self._size_runs.get(plan.variant, {})
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

    def _phase_end_reason(self) -> str:
        """Why the phase that has nothing more to propose ended: a limit it reached, or ""
        where it ran all it had."""
        if self._phase is Phase.remeasure:
            return ""
        if self._search_budget_spent():
            return f"tuner_num_trials ({self._tuning.tuner_num_trials}) reached"
        if self._sampler is not None and self._patience_spent():
            return f"no better result in the last {self._tuning.tuner_early_stopping} experiments"
        return ""

    def _advance(self) -> None:
        """End the current phase (keeping why, if a limit ended it) and move to the next
        phase that has something to do."""
        reason = self._phase_end_reason()
        if reason:
            self._stop_reason = reason
        self._note_unreached(reason or "the phase ended")
        self._sampler, self._phase_points, self._point_names = None, {}, {}
        self._phase = _PHASES[_PHASES.index(self._phase) + 1]
        if self._phase is Phase.micro_batch:
            self._start_micro_batch_phase()
        elif self._phase is Phase.knobs:
            self._start_knob_phase()
        elif self._phase is Phase.remeasure:
            self._start_remeasure()
        elif not self._stop_reason:
            self._stop_reason = "search space exhausted"

    def _start_micro_batch_phase(self) -> None:
        subspaces, names = [], {}
        for plan in self._space.plans:
            largest = self._largest_fit(plan.variant)
            if largest is None:
                # Never run is not the same as nothing fits: the trial cap or the time budget
                # can end the search before it reaches a variant.
                reason = "not searched: the search ended first"
                if plan.variant in self._size_runs:
                    reason = "no micro-batch ran ok"
                self._pruned.setdefault(plan.variant.label, reason)
                continue
            # Largest first: the grid tries large micro-batches (usually fastest) first.
            sizes = plan.compared_sizes(largest)
            subspace = Subspace(
                plan.variant.label, ((MICRO_BATCH_KEY, sizes),), self._best_score(plan.variant)
            )
            subspaces.append(subspace)
            for point in subspace.points():
                names[point] = self._register(plan.variant, point.as_dict()[MICRO_BATCH_KEY], ())
        self._start_sampler(subspaces, names)

    def _start_knob_phase(self) -> None:
        subspaces, names = [], {}
        for plan in self._space.plans:
            size = self._best_micro_batch(plan)
            if size is None or not plan.knobs:
                continue
            subspace = Subspace(
                plan.variant.label,
                plan.knobs,
                self._best_score(plan.variant),
                self._recommended(plan),
            )
            subspaces.append(subspace)
            for point in subspace.points():
                names[point] = self._register(plan.variant, size, point.values)
        self._start_sampler(subspaces, names)

    def _start_sampler(self, subspaces: list[Subspace], names: dict[Point, str]) -> None:
        """Make the phase's sampler and tell it the results it already has (a resumed run)."""
        if not subspaces:
            return
        self._stop_reason = ""  # each search phase ends for its own reason
        self._sampler = make_sampler(
            self._tuning.tuner_type,
            subspaces,
            seed=self._tuning.seed + _PHASES.index(self._phase),
            storage=self._storage,
            # The metric is in the name: a resumed run with another metric starts a new study
            # instead of mixing the old objective's scores into the new one's model.
            study_name=f"autotune-{self._tuning.metric.value}-{self._phase.value}",
        )
        self._point_names = names
        self._phase_points = {name: point for point, name in names.items()}
        for name in self._order:
            if name in self._phase_points:
                self._tell_sampler(self._phase_points[name], self._results[name])

    def _next_repeat(self) -> str | None:
        """The first queued re-measurement not yet run that the time budget has room for;
        those it has no room for are noted and never run."""
        for name in self._repeats:
            if not self._is_open_repeat(name) or name in self._ended:
                continue
            if self._fits_time_budget(name):
                return name
            reason = self._time_budget_reason()
            self._ended[name] = f"not run: {reason}"
            self._stop_reason = reason
        return None

    # --- the time budget ----------------------------------------------------------------------

    def _fits_time_budget(self, name: str) -> bool:
        """Whether ``name`` is expected to end within ``time_budget_s`` (see
        :mod:`autotune.tuner.budget`) with time left to end the run; while the search goes
        on, and for one re-measurement of the best so far. True when nothing can be
        predicted yet."""
        budget = self._tuning.time_budget_s
        if budget is None:
            return True
        needed = self._predicted_s(name)
        if needed is None:
            return True
        # The run's own start-up (its cluster, before the first experiment) is kept for its
        # end, which stops what it started: an upper bound (a local Ray cluster here took
        # 3.4 s to start and 1.4 s to shut down).
        first_asked = self._clock() if self._first_asked is None else self._first_asked
        needed += first_asked - self._started
        if self._phase is not Phase.remeasure:
            ranking = rank((self._results[n] for n in self._search_results()), self._tuning.metric)
            best = next((r.name for r in ranking if r.name in self._entries), None)
            needed += (self._predicted_s(best) or 0.0) if best is not None else 0.0
        return self.elapsed_s + needed <= budget

    def _predicted_s(self, name: str) -> float | None:
        """How long ``name`` should take: from its own earlier measurements where it has
        some (a re-measurement), else from every configuration's."""
        base = split_repeat(name)[0]
        micro_batch = self._entries[base].micro_batch_size
        finished = []
        for result_name, result in self._results.items():
            entry = self._entries.get(split_repeat(result_name)[0])
            if result.ok and entry is not None:
                own = split_repeat(result_name)[0] == base
                finished.append((own, entry.micro_batch_size, result.timings))
        return predicted_duration_s(
            micro_batch,
            [(size, timings) for _, size, timings in finished],
            own=[timings for own, _, timings in finished if own],
        )

    def _time_budget_reason(self) -> str:
        return f"time budget of {self._tuning.time_budget_s:g} s"

    def _end_search_for_time(self, name: str) -> None:
        """The search's next experiment would not end in time: what is left of the budget
        goes to re-measuring what the search found."""
        reason = self._time_budget_reason()
        if self._tuning.num_remeasure > 0:
            reason += ": the rest kept for re-measuring the best"
        point = self._phase_points.get(name)
        if point is not None and self._sampler is not None:
            self._sampler.tell(point, None)
        self._ended[name] = f"not run: {reason}"
        self._note_unreached(reason)
        self._stop_reason = reason
        self._sampler, self._phase_points, self._point_names = None, {}, {}
        self._phase = Phase.remeasure
        self._start_remeasure()

    def _start_remeasure(self) -> None:
        """Queue the first re-measurements, round by round (every ``_r1``, then every
        ``_r2``, so slow drift hits all alike): ``num_repeats`` each for the top
        ``num_remeasure`` configurations and every variant's best, one check each for the
        suspects (:meth:`_suspects`).

        Every variant's best is measured again, interleaved with its rivals, so no stage's
        standing rests on one stretch of time: a stage whose search fell in a slow minute (a
        neighbour's job, the cluster's start-up, a GPU's clocks) is measured again beside the
        others.
        """
        limit = self._tuning.num_remeasure
        if limit == 0:
            return
        # Only original measurements: replayed repeats must not change which ones are repeated.
        ranking = rank((self._results[n] for n in self._search_results()), self._tuning.metric)
        ranking = [r for r in ranking if r.name in self._entries]
        claims = [r.name for r in ranking[:limit]]
        best_of: dict[Variant, Ranked] = {}
        for ranked in ranking:
            best_of.setdefault(self._entries[ranked.name].variant, ranked)
        claims += [r.name for r in best_of.values() if r.name not in claims]
        suspects = [n for n in self._suspects(ranking, best_of) if n not in claims]
        # Those, and up to num_remeasure more that repeats show could still be the best.
        self._max_remeasured = len(claims) + len(suspects) + limit
        self._repeats = [repeat_name(name, 1) for name in claims + suspects] + [
            repeat_name(name, index) for index in range(2, self._num_repeats + 1) for name in claims
        ]

    def _suspects(self, ranking: list[Ranked], best_of: Mapping[Variant, Ranked]) -> list[str]:
        """Configurations whose standing within their variant a slow stretch may have hidden,
        each measured once more: the variant's largest fit where a smaller size beat it (a
        larger micro-batch amortises more: the first suspect of drift no rank could see), and
        any measured only while other processes competed for the cores that could, had they
        not, be its variant's best."""
        suspects = []
        for variant, best in best_of.items():
            largest = self._largest_fit(variant)
            if largest is not None and self._size_runs[variant][largest].name != best.name:
                suspects.append(self._size_runs[variant][largest].name)
        metric = self._tuning.metric
        suspects += [
            r.name
            for r in ranking
            if r.disturbed
            and self._quiet_bound(r.name)
            > metric.score(best_of[self._entries[r.name].variant].value)
        ]
        return list(dict.fromkeys(suspects))

    def _quiet_bound(self, name: str) -> float:
        """The best score ``name``'s disturbed measurements allow on a quiet machine: each
        one's score improved by how far its node was oversubscribed (a node with demand for
        1.5 times its cores runs the ranks at least 1/1.5 of their speed)."""
        bound = float("-inf")
        for result_name, result in self._results.items():
            if split_repeat(result_name)[0] != name or not result.ok or result.metrics is None:
                continue
            value = score(result.metrics, self._tuning.metric)
            factor = 1.0 + (result.metrics.oversubscription or 0.0)
            bound = max(bound, value * factor if value > 0 else value / factor)
        return bound

    def _extend_remeasure(self) -> bool:
        """Queue more re-measurements once a round is done; True if any.

        Repeats pull lucky first measurements down to their median, so a configuration
        measured once can overtake them; and one measured unluckily low may trail the leader
        by less than the noise the repeats show (:func:`could_be_better`). Either earns
        repeats too, best first, up to ``num_remeasure`` more configurations, so the declared
        best is one that was repeated, no single lucky measurement stands above it unchecked
        and no single unlucky one rules a rival out. Then the race (:meth:`_race`).
        """
        limit = self._tuning.num_remeasure
        repeated = {split_repeat(n)[0] for n in self._repeats}
        ranking = [
            r for r in rank(self._results.values(), self._tuning.metric) if r.name in self._entries
        ]
        contenders = ranking[:limit]
        measurable = [r for r in ranking if r.name not in self._short_windows()]
        noise = relative_noise([r for r in measurable if r.name in repeated])
        if noise is not None and measurable:
            contenders += [
                r
                for r in measurable
                if r not in contenders
                and could_be_better(
                    measurable[0],
                    r,
                    noise,
                    confidence_z=RACE_CONFIDENCE_Z,
                    tolerance=RACE_TOLERANCE,
                )
            ]
        newcomers = [r.name for r in contenders if r.name not in repeated]
        newcomers = newcomers[: max(0, self._max_remeasured - len(repeated))]
        self._repeats += [
            repeat_name(name, index)
            for index in range(1, self._num_repeats + 1)
            for name in newcomers
        ]
        if newcomers or self._promote(ranking):
            return True
        return self._race([r for r in ranking if r.name in repeated])

    def _short_windows(self) -> dict[str, float]:
        """Configurations whose profile window lasted under :data:`MIN_WINDOW_S` (median
        over their ok runs), with that median."""
        windows: dict[str, list[float]] = {}
        for name, result in self._results.items():
            if result.ok and result.timings.window_s > 0:
                windows.setdefault(split_repeat(name)[0], []).append(result.timings.window_s)
        medians = {name: statistics.median(seconds) for name, seconds in windows.items()}
        return {name: s for name, s in medians.items() if s < MIN_WINDOW_S}

    def _promote(self, ranking: list[Ranked]) -> bool:
        """Give a suspect measured once again (see :meth:`_suspects`) whose check beat its
        variant's leader the repeats a variant's best gets; True if any were queued. Its
        check, not its first measurement, is the one to believe: the first is the suspect."""
        queued = Counter(split_repeat(n)[0] for n in self._repeats)
        leaders: dict[Variant, Ranked] = {}
        for ranked in ranking:
            if queued[ranked.name] >= self._num_repeats:
                leaders.setdefault(self._entries[ranked.name].variant, ranked)
        metric = self._tuning.metric
        promoted = []
        for ranked in ranking:
            leader = leaders.get(self._entries[ranked.name].variant)
            if not 0 < queued[ranked.name] < self._num_repeats:
                continue
            checks = [
                score(r.metrics, metric)
                for n, r in self._results.items()
                if split_repeat(n)[0] == ranked.name
                and split_repeat(n)[1] > 0
                and r.ok
                and r.metrics is not None
                and not r.metrics.disturbed
            ]
            if checks and (leader is None or max(checks) > metric.score(leader.value)):
                promoted.append(ranked.name)
        self._repeats += [
            repeat_name(name, index)
            for index in range(2, self._num_repeats + 1)
            for name in promoted
            if index > queued[name]
        ]
        return bool(promoted)

    def _race(self, contenders: list[Ranked]) -> bool:
        """One more round for the leader and every re-measured configuration that could still
        beat it by more than the noise allows (:func:`could_be_better`), and for every one
        whose repeats were disturbed (other processes competed for the cores); True if
        queued.

        Two or three repeats tell apart configurations a noise-width apart, not ones a few
        percent apart on a machine whose runs vary by 10%: those race on, up to
        :data:`MAX_RACE_ROUNDS` more measurements each, while the ones clearly behind drop out.
        A rival within :data:`RACE_TOLERANCE` of the leader that even those rounds could not
        tell from it (:func:`race_can_settle`) is a tie at this machine's noise and does not
        race: the summary says the top are within noise of each other.
        A configuration left with fewer undisturbed measurements than its repeats were meant
        to give is measured again too, up to the same bound, so that it ranks on the machine
        it will train on, not on a busy minute.
        """

        def open_rounds(ranked: list[Ranked]) -> list[tuple[str, int]]:
            """Those not yet at the bound, with the repeats each has so far."""
            counts = [
                (r.name, sum(1 for q in self._repeats if split_repeat(q)[0] == r.name))
                for r in ranked
            ]
            return [(n, c) for n, c in counts if c < self._num_repeats + MAX_RACE_ROUNDS]

        racing: list[tuple[str, int]] = []
        # The race is for the top: the best few of the re-measured (every variant's best is
        # re-measured for its own standing, not to race).
        short = self._short_windows()
        top = [r for r in contenders if r.name not in short]
        top = top[: MAX_REMEASURE_FACTOR * self._tuning.num_remeasure]
        noise = relative_noise(top)
        if noise is not None and len(top) >= 2:
            leader, *others = top
            # A rival races while it may still beat the leader and the rounds left could
            # tell: on a noisy machine, ones within the tolerance stay tied however long.
            most = 1 + self._num_repeats + MAX_RACE_ROUNDS
            rivals = [
                r
                for r in others
                if could_be_better(
                    leader, r, noise, confidence_z=RACE_CONFIDENCE_Z, tolerance=RACE_TOLERANCE
                )
                and race_can_settle(
                    leader, r, noise, tolerance=RACE_TOLERANCE, max_measurements=most
                )
            ]
            racing = open_rounds([leader, *rivals])
            if not racing or racing[0][0] != leader.name or len(racing) < 2:
                racing = []  # the leader is done racing, or nothing races it
        # Measured again for a reason the disturbance spoiled: once more, up to the bound.
        queued = Counter(split_repeat(n)[0] for n in self._repeats)
        disturbed = [
            r for r in contenders if r.num_disturbed and r.num_undisturbed < queued[r.name]
        ]
        racing += [(n, c) for n, c in open_rounds(disturbed) if n not in dict(racing)]
        self._repeats += [repeat_name(n, count + 1) for n, count in racing]
        return bool(racing)

    def _finish(self, reason: str) -> None:
        self._note_unreached(reason)
        self._phase, self._sampler, self._stop_reason = Phase.done, None, reason

    def _note_unreached(self, reason: str) -> None:
        """Why the current phase's configurations that never ran did not (for the summary)."""
        for name in self._phase_points:
            if name not in self._results and name not in self._pending:
                self._ended.setdefault(name, f"not reached: {reason}")

    # --- bookkeeping --------------------------------------------------------------------------

    def _candidate(self, name: str) -> Candidate | None:
        """The experiment for ``name``; None (and pruned) if its config breaks a rule."""
        base, _ = split_repeat(name)
        entry = self._entries[base]
        try:
            ds_config = self._ds_config(entry.overrides)
        except ConfigError as err:
            self._pruned[name] = str(err)
            point = self._phase_points.get(name)
            if point is not None and self._sampler is not None:
                self._sampler.tell(point, None)
            return None
        return Candidate(
            name=name,
            overrides=entry.overrides,
            ds_config=ds_config,
            phase=self._phase,
            repeat_of=base if base != name else None,
        )

    def _ds_config(self, overrides: Mapping[str, Any]) -> dict[str, Any]:
        ds_config = self._config.with_overrides(overrides).to_dict()
        ds_config.pop("autotuning", None)
        return ds_config

    def _use_space(self, space: TuningSpace) -> None:
        """Search ``space`` from now on (see :meth:`learn_model`)."""
        self._space = space
        self._pruned.update(space.pruned)
        self._add_size_names(space)
        self._probe_plans = variant_order(
            space.plans,
            self._tuning.tuner_type,
            self._tuning.seed,
            self._model_info,
        )

    def _add_size_names(self, space: TuningSpace) -> None:
        for plan in space.plans:
            for size in plan.ladder:
                self._size_names.setdefault(
                    self._name(plan.variant, size, ()), (plan.variant, size)
                )
                if not plan.halving:  # sizes the user listed are candidates, each accounted for
                    self._register(plan.variant, size, ())

    def _register(self, variant: Variant, size: int, knobs: tuple[tuple[str, Any], ...]) -> str:
        name = self._name(variant, size, knobs)
        if name not in self._entries:
            overrides = self._space.overrides(variant, size, dict(knobs))
            self._entries[name] = _Entry(variant, size, knobs, overrides)
            self._note_oom(name)
            self._note_micro_batch(name)
        return name

    def _name(self, variant: Variant, size: int, knobs: tuple[tuple[str, Any], ...]) -> str:
        return self._space.name(self._space.overrides(variant, size, dict(knobs)))

    def _note_oom(self, name: str) -> None:
        """Remember the smallest micro-batch that ran out of memory, per variant and knobs."""
        entry, result = self._entries.get(name), self._results.get(name)
        if entry is None or result is None or result.status is not Status.oom:
            return
        key = (entry.variant, entry.knobs)
        floor = self._oom_floor.get(key)
        if floor is None or entry.micro_batch_size < self._entries[floor].micro_batch_size:
            self._oom_floor[key] = name

    def _oom_pruner(self, name: str) -> str | None:
        """The experiment that ran out of memory at a micro-batch no larger than ``name``'s."""
        entry = self._entries.get(name)
        if entry is None:
            return None
        floor = self._oom_floor.get((entry.variant, entry.knobs))
        if floor is None or self._entries[floor].micro_batch_size > entry.micro_batch_size:
            return None
        return floor

    def _not_run(self) -> dict[str, str]:
        """Every variant, bound and configuration the tuner considered and did not run, with
        the reason: pruned (memory estimate, an ``oom`` below it, the data bound, a config
        rule), or not reached (the phase or the run ended first, and why)."""
        explained = {
            **self._pruned,
            **self._failed_sizes_bound(),
            **self._pruned_by_data(),
            **self._pruned_by_oom(),
        }
        ended = f"not reached: the search ended first ({self._stop_reason or 'search complete'})"
        for name, entry in self._entries.items():
            if name in self._results or name in self._pending or name in explained:
                continue
            explained[name] = self._ended.get(name) or self._pruned.get(entry.variant.label, ended)
        return explained

    def _pruned_by_oom(self) -> dict[str, str]:
        return {
            name: f"larger than {floor}, which ran out of memory"
            for name in self._entries
            if name not in self._results and (floor := self._oom_pruner(name)) is not None
        }

    def _note_micro_batch(self, name: str) -> None:
        """Remember whether the script had data enough at ``name``'s micro-batch."""
        entry, result = self._entries.get(name), self._results.get(name)
        if entry is None or result is None:
            return
        if result.ok:
            self._ok_sizes.add(entry.micro_batch_size)
        elif result.ended_early:
            self._out_of_data.setdefault(entry.micro_batch_size, name)

    def _data_ceiling(self) -> str | None:
        """The run at the smallest micro-batch where the script ran out of data, above every
        size that ran ok (one that ran ok had data enough, whatever ended another run)."""
        if self._step_limit() is not None:  # the script stops itself: no data bound shown
            return None
        largest_ok = max(self._ok_sizes, default=0)
        sizes = [size for size in self._out_of_data if size > largest_ok]
        return self._out_of_data[min(sizes)] if sizes else None

    def _data_ceiling_size(self) -> int | None:
        ceiling = self._data_ceiling()
        return None if ceiling is None else self._entries[ceiling].micro_batch_size

    def _data_pruner(self, name: str) -> str | None:
        """The run that ran out of data at a micro-batch no larger than ``name``'s."""
        entry, ceiling = self._entries.get(name), self._data_ceiling()
        if entry is None or ceiling is None:
            return None
        return (
            ceiling if entry.micro_batch_size >= self._entries[ceiling].micro_batch_size else None
        )

    def _pruned_by_data(self) -> dict[str, str]:
        """Why no micro-batch at or above the data bound runs, once for all variants and
        for each such configuration already considered."""
        ceiling = self._data_ceiling()
        if ceiling is None:
            return {}
        size = self._entries[ceiling].micro_batch_size
        pruned = {
            f"micro-batch >= {size}": (
                f"the script ran out of data at micro-batch {size} ({ceiling}): its loader has "
                "fewer batches than the profile window needs; pruned in every ZeRO variant"
            )
        }
        pruned.update(
            (name, f"micro-batch {size} or larger, where the script ran out of data ({ceiling})")
            for name in self._entries
            if name not in self._results and self._data_pruner(name) is not None
        )
        return pruned

    def _same_failure(self) -> str | None:
        """The first error line, once the first ``SAME_FAILURE_LIMIT`` experiments all failed
        alike and none ran ok; None otherwise. Numbers aside: argparse echoes the value it
        rejects. ``oom``, ``timeout`` and running out of data depend on the config: any of
        them means the config matters, so the run goes on."""
        results = [self._results[name] for name in self._order]
        if len(results) < SAME_FAILURE_LIMIT:
            return None
        if any(r.status is not Status.error or r.ended_early for r in results):
            return None
        if len({re.sub(r"\d+", "N", r.error or "") for r in results}) != 1:
            return None
        return results[0].error or "(no message)"

    def _step_limit(self) -> int | None:
        """The steps the script ends after at two micro-batches that running out of data
        cannot explain, or None.

        Data for ``s`` steps of ``m1`` but not ``s + 1`` holds fewer than ``(s + 1) * m1``
        samples per rank, so at ``m2`` it gives ``s`` steps only if ``s * m2 < (s + 1) * m1``;
        otherwise the script stops itself.
        """
        ended = sorted(
            (r.ended_after_steps, self._entries[n].micro_batch_size)
            for n, r in self._results.items()
            if r.ended_after_steps is not None and n in self._entries
        )
        for (steps, small), (same, large) in itertools.pairwise(ended):
            if steps == same and large * steps >= small * (steps + 1):
                return steps
        return None

    def _is_open(self, name: str) -> bool:
        """Not run, not in flight, not pruned."""
        return (
            self._is_free(name)
            and name not in self._pruned
            and not self._oom_pruner(name)
            and not self._data_pruner(name)
        )

    def _is_open_repeat(self, name: str) -> bool:
        return self._is_free(name) and name not in self._pruned

    def _is_free(self, name: str) -> bool:
        return name not in self._results and name not in self._pending

    def _status(self, name: str) -> Status | None:
        result = self._results.get(name)
        return result.status if result is not None else None

    def _largest_fit(self, variant: Variant) -> int | None:
        runs = self._size_runs.get(variant, {})
        return max((s for s, r in runs.items() if r.ok), default=None)

    def _best_micro_batch(self, plan: VariantPlan) -> int | None:
        """The best of the sizes the micro-batch phase compared (not of the memory search's)."""
        largest = self._largest_fit(plan.variant)
        if largest is None:
            return None
        runs = self._size_runs.get(plan.variant, {})
        compared = [runs[s] for s in plan.compared_sizes(largest) if s in runs]
        metric = self._tuning.metric
        ranking = rank(compared, metric)
        if not ranking:
            return None
        best = self._entries[ranking[0].name].micro_batch_size
        if TunerType(self._tuning.tuner_type) is TunerType.model_based:
            # The ZeRO model's prior: a larger micro-batch amortizes the step's fixed costs, so
            # the largest fit stands unless a smaller one beat it by more than the noise.
            at_largest = next((r for r in ranking if r.name == runs[largest].name), None)
            if at_largest is not None and largest_micro_batch_stands(
                at_largest.value, ranking[0].value, metric
            ):
                return largest
        return best

    def _best_score(self, variant: Variant) -> float | None:
        """The variant's best result so far, any phase (None before one ran ok)."""
        metric = self._tuning.metric
        return max(
            (
                score(r.metrics, metric)
                for name, r in self._results.items()
                if r.ok
                and r.metrics
                and name in self._entries
                and self._entries[name].variant == variant
            ),
            default=None,
        )

    def _is_largest_fit(self, name: str) -> bool:
        entry = self._entries.get(name)
        if entry is None or entry.knobs:
            return False
        return self._largest_fit(entry.variant) == entry.micro_batch_size

    def _entry(self, name: str) -> _Entry | None:
        """The configuration ``name`` names, registering a micro-batch run told from history."""
        if name not in self._entries and name in self._size_names:
            self._register(*self._size_names[name], ())
        return self._entries.get(name)

    def _tell_sampler(self, point: Point, result: ExperimentResult) -> None:
        assert self._sampler is not None
        value = score(result.metrics, self._tuning.metric) if result.metrics and result.ok else None
        self._sampler.tell(point, value, infeasible=result.status is Status.oom)

    def _search_results(self) -> Iterable[str]:
        return (n for n in self._order if split_repeat(n)[1] == 0)

    def _search_budget_spent(self) -> bool:
        in_flight = sum(1 for c in self._pending.values() if c.repeat_of is None)
        spent = sum(1 for _ in self._search_results()) + in_flight
        return spent >= self._tuning.tuner_num_trials

    def _patience_spent(self) -> bool:
        return self._since_best() >= self._tuning.tuner_early_stopping

    def _of_a_later_phase(self, name: str) -> bool:
        """A knob experiment while the micro-batch phase runs: replayed from a run that got
        further, it must not end or extend the micro-batch search (a resumed run decides each
        phase on what that phase knew)."""
        entry = self._entries.get(name)
        return entry is None or (self._phase is Phase.micro_batch and bool(entry.knobs))

    def _since_best(self) -> int:
        """Experiments of this phase since the last new best (of any phase), in the order
        they were proposed.

        One in flight, and every one proposed after it, counts as no better: an upper bound,
        exact once nothing is in flight, so that experiments running side by side never go
        past where a one-at-a-time run would have stopped.
        """
        best: float | None = None
        since = 0
        unsettled = False
        for name in self._proposed:
            if split_repeat(name)[1] != 0 or self._of_a_later_phase(name):
                continue
            result = self._results.get(name)
            unsettled = unsettled or result is None
            value = None
            if not unsettled and result is not None and result.ok and result.metrics:
                value = score(result.metrics, self._tuning.metric)
            if value is not None and (best is None or value > best):
                best, since = value, 0
            elif name in self._phase_points and not self._is_largest_fit(name):
                # The largest fit is the micro-batch search's result, run before this phase:
                # where it falls among other variants' searches depends on what ran beside it.
                since += 1
        return since


def _failure_line(result: ExperimentResult) -> str:
    """``"oom: OutOfMemoryError: ..."``: the status, then the error unless it already says it."""
    status, error = result.status.value, result.error or ""
    return error if error.startswith(f"{status}:") else f"{status}: {error}" if error else status


def fails_alone(result: ExperimentResult) -> bool:
    """An ``error`` or ``timeout`` that is a verdict on its own configuration only: not an
    ``oom`` (memory grows with the micro-batch) nor a script that ran out of data."""
    return result.status in (Status.error, Status.timeout) and not result.ended_early


def _memory_guess(plan: VariantPlan, runs: Mapping[int, ExperimentResult]) -> int | None:
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
