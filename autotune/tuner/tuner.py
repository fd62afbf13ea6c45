"""The tuner: decides what to run next and when to stop, behind ask/tell. It runs nothing.

``model_based`` (the default) predicts, then measures: one phase, ``model``
(:mod:`autotune.tuner.model_search`), predicts every configuration of the space with a cost
model of the ZeRO step fitted to what the run measured, measures the one with the largest
expected improvement over the best, refits, and ends when no configuration left could beat
the best by more than the tolerance.

``gridsearch`` and ``random`` (the baselines) follow DeepSpeed's flow, with its bugs fixed,
one phase after another:

1. ``max_micro_batch``: per ZeRO variant, find the largest micro-batch that fits, exactly
   (:mod:`autotune.tuner.probe`). Variants are searched one after another, in an order the
   tuner type decides (:func:`~autotune.tuner.prior.variant_order`).
2. ``micro_batch``: compare the largest fit and sizes about half apart below it
   (``num_tuning_micro_batch_sizes`` in all), per variant, with the chosen sampler.
   ``fast: true`` (and no knob lists) stops the search here.
3. ``knobs``: each surviving variant at its best micro-batch, over its knobs.

Then, for every tuner type, ``remeasure`` (:mod:`autotune.tuner.remeasure`): a configuration
is measured again only where another measurement could change the answer.

Failures bound the rest of the space (:mod:`autotune.tuner.bounds`): an ``oom`` prunes every
larger micro-batch with the same stage and knobs, a script that ran out of data every larger
micro-batch in every variant, and a script that ends after as many steps whatever the
micro-batch ends the run, saying so. The search phases end early after
``tuner_early_stopping`` experiments without a new best (:mod:`autotune.tuner.stopping`); the
whole run ends once the first :data:`~autotune.tuner.bounds.SAME_FAILURE_LIMIT` experiments
all failed with the same error. ``tuner_num_trials`` caps every experiment the run starts,
re-measurements included (the search leaves one for confirming its best). ``time_budget_s``
bounds the run's wall time: an experiment starts only if it is expected to end within it
(:mod:`autotune.tuner.budget`), and the search ends where its next experiment would leave no
room to re-measure the best so far. Once something ran ok, a search experiment carries the
step time above which it cannot come within the tolerance of the best
(:attr:`Candidate.stop_above_step_s`): a loser is stopped after its first timed steps.

Several experiments may be in flight at once. ``ask`` then returns None both when the search
is over and when the next proposal needs a result first (the end of a phase, the next step of
a micro-batch descent, early stopping that in-flight results may still settle): ``finished``
tells the two apart. The trial cap and early stopping count experiments in flight, so a run
with several at once proposes exactly what a one-at-a-time run would (given the same results).

Every decision is derived from the results told so far, so a resumed run re-seeds the tuner by
telling it the results log before asking (names identify configurations), in the order the
experiments were proposed, with those left unfinished owed in their places (:meth:`Tuner._owe`).

A script's model is unknown until an experiment measures it: :meth:`Tuner.learn_model` then
brings in the memory estimate and the cost model for what is not yet decided, keeping
everything run, running or owed (ranked even where the estimate would now prune it). A tuner
that knew the model from the start, told the same results, decides alike, so a resumed script
run needs no replay of when the model was learnt.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Container, Iterable, Mapping
from typing import TYPE_CHECKING, Any

from autotune.config import AutotuningConfig, Config, ConfigError, Metric, TunerType
from autotune.config.knobs import MICRO_BATCH_KEY
from autotune.experiment import ExperimentResult
from autotune.tuner.bounds import SAME_FAILURE_LIMIT, Bounds
from autotune.tuner.budget import TimeBudget
from autotune.tuner.candidate import MODEL_PHASES, SAMPLED_PHASES, Candidate, Phase
from autotune.tuner.catalog import Catalog
from autotune.tuner.cost_model import CostModel, ModelShape
from autotune.tuner.hardware import CPU_RANK, Hardware
from autotune.tuner.ledger import Ledger
from autotune.tuner.ledger import TrialState as LedgerState
from autotune.tuner.model_search import ModelSearch
from autotune.tuner.phase_search import PhaseSearch
from autotune.tuner.prior import best_micro_batch
from autotune.tuner.probe import SizeSearch, failed_sizes_bound
from autotune.tuner.ranking import TOLERANCE
from autotune.tuner.reasons import NotRunKind, NotRunReason, StopKind, StopReason
from autotune.tuner.remeasure import CONTROL_AT_END, Remeasurement
from autotune.tuner.samplers import Point, Subspace
from autotune.tuner.space import build_space
from autotune.tuner.stopping import experiments_since_best
from autotune.tuner.summary import TuningSummary, summarize
from autotune.tuner.trials import (
    PHASE_ATTR,
    REPEAT_OF_ATTR,
    TrialLog,
    new_study,
    past_experiments,
)
from autotune.tuner.warm_start import WarmStart

if TYPE_CHECKING:
    import optuna

    from autotune.profiling.model_info import ModelInfo

# How much slower than the tolerance allows a search experiment's first timed steps must be
# before it is stopped as a loser: a single step varies by a few percent, and so does the
# best's own value.
LOSER_MARGIN = 0.15


class Tuner:
    """Proposes experiments one at a time and learns from their results.

    Args:
        config: the user's config, search lists and ``autotuning`` section included.
        model_info: the workload's sizes, for the memory estimate (optional).
        device_memory_bytes: per-rank device budget (default: ``config.device_memory_bytes``);
            without it and ``model_info``, stages are pruned only by running out of memory.
        study: the Optuna study that records the run (:mod:`autotune.tuner.trials`): every
            experiment the tuner proposes is a trial of it, and whatever it already holds (a
            resumed run) is replayed first, in the order it was proposed, those left running
            owed a run. None: a study in memory, for this tuner alone.
        clock: seconds, monotonic; injectable for tests.
        started: the ``clock`` reading ``time_budget_s`` counts from (the command's start);
            None: now.
        hardware: what the ranks run on, the cost model's starting point (``model_based``;
            default: CPU ranks).
        ranks_per_node: ranks that share a node's links (default: all of them).
        warm_start: what earlier runs on the same hardware taught (``model_based``): their
            fitted cost model as the prior, their answers measured first.

    Raises:
        ConfigError: if the batch limits leave no micro-batch size.

    Example:
        >>> from autotune.config import load_config
        >>> tuner = Tuner(load_config({"zero_optimization": {"stage": 1}}, world_size=2))
        >>> candidate = tuner.ask()
        >>> candidate.name, candidate.phase.value
        ('z1_mbs1024', 'model')

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
        study: optuna.Study | None = None,
        clock: Callable[[], float] = time.monotonic,
        started: float | None = None,
        hardware: Hardware | None = None,
        ranks_per_node: int | None = None,
        warm_start: WarmStart | None = None,
    ) -> None:
        self._config = config
        self._tuning = config.autotuning
        if device_memory_bytes is None:
            device_memory_bytes = config.device_memory_bytes
        self._device_memory_bytes = device_memory_bytes
        self._model_info = model_info
        self._ledger = Ledger()
        self._bounds = Bounds(self._ledger)
        self._remeasure = Remeasurement(self._ledger, self._tuning)
        model_based = TunerType(self._tuning.tuner_type) is TunerType.model_based
        self._phases = MODEL_PHASES if model_based else SAMPLED_PHASES
        self._phase = self._phases[0]
        self._search: PhaseSearch | None = None  # the sampled phase's, while one runs
        self._stop: StopReason | None = None  # why the search ended, once it did
        self._budget = TimeBudget(self._ledger, self._tuning.time_budget_s, clock, started)
        space = build_space(config, model_info, device_memory_bytes)
        self._catalog = Catalog(self._ledger, self._bounds, space)
        self._sizes = SizeSearch(self._catalog, self._ledger, self._bounds, self._tuning)
        self._sizes.order(space, model_info)
        if model_info is not None and space.pruned:
            # What a run that did not know the model yet may have tried (a script's first
            # experiments), so that their results, told from history, are ranked too.
            self._catalog.add_size_names(build_space(config, None, device_memory_bytes))
        self._model_search: ModelSearch | None = None
        if model_based:
            self._model_search = ModelSearch(
                config,
                self._catalog,
                self._ledger,
                self._bounds,
                hardware or CPU_RANK,
                ranks_per_node or config.world_size,
                _model_shape(model_info),
                warm_start.prior() if warm_start is not None else None,
            )
        # Earlier runs' answers, tried first by model_based where its space holds them.
        self._warm_answers = list(warm_start.answers) if warm_start is not None else []
        self._trials = TrialLog(study or _study_in_memory(self._tuning), self._tuning.metric)
        self._replay(self._trials.study)

    # --- the interface ------------------------------------------------------------------------

    @property
    def phase(self) -> Phase:
        return self._phase

    @property
    def finished(self) -> bool:
        """True when nothing more will be proposed and nothing is in flight."""
        return self._phase is Phase.done and not self._ledger.pending

    @property
    def elapsed_s(self) -> float:
        """Tuning time: this process's, plus the wall time replayed results took (their
        overlapping intervals counted once)."""
        return self._budget.elapsed_s

    def ask(self) -> Candidate | None:
        """The next experiment to run, or None: finished, or waiting for results in flight.

        Several candidates may be in flight at once; a phase ends only once all its results
        are in, so None with candidates pending means "tell me something first".
        """
        if self._phase is not Phase.done and (reason := self._run_end_reason()) is not None:
            self._finish(reason)
        while self._phase is not Phase.done:
            name = self._next_name()
            if name is None:
                if self._ledger.pending:
                    return None
                self._advance()
                continue
            candidate = self._candidate(name)
            if candidate is not None and not self._fits_time_budget(name):
                self._end_search_for_time(name)
                continue
            if candidate is not None:
                self._budget.asked()
                return self._start(candidate)
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
        space = build_space(self._config, model_info, self._device_memory_bytes)
        self._catalog.use_space(space)
        self._sizes.order(space, model_info)
        if self._model_search is not None:
            self._model_search.use_space(space, _model_shape(model_info))

    def _owe(self, name: str, number: int | None = None, repeat_of: str | None = None) -> None:
        """Replay an experiment an interrupted run proposed but never finished, in its place
        among the replayed results (call in the order they were proposed; ``number``: the
        number it was proposed as, kept when it runs again).

        Until it is run again it counts as in flight for early stopping, and its phase
        proposes it before anything new, so the resumed run decides as the interrupted one
        would have.
        """
        self._ledger.owe(name, number, repeat_of)

    def tell(self, result: ExperimentResult) -> None:
        """Record a finished experiment of any status: its trial is told (the commit point).

        A result the tuner did not ask for is history: it is added to the study as a
        finished trial, numbered next, and its duration counts toward the time budget.
        Telling a name twice keeps the first result.
        """
        if result.name in self._ledger.results:
            return
        candidate = self._ledger.pending.get(result.name)
        if candidate is not None:
            self._trials.finish(result, candidate.ds_config)
            self._learn(result, None)
            return
        params, dists = self._trial_params(result.name)
        number = self._trials.add(result, params, dists, {PHASE_ATTR: self._phase.value})
        self._learn(result, number)

    def _replay(self, study: optuna.Study) -> None:
        """Tell what ``study`` holds of an earlier run, in the order it was proposed: the
        finished experiments, and those left running, owed a run with their numbers."""
        for past in past_experiments(study.get_trials(deepcopy=False)):
            if past.result is None:
                self._owe(past.name, past.number, past.repeat_of)
            else:
                self.num_replayed += 1
                self._learn(past.result, past.number, past.repeat_of)

    def _learn(
        self, result: ExperimentResult, number: int | None, repeat_of: str | None = None
    ) -> None:
        """Take in a result, of an experiment asked for or one of the run's history
        (``number``: the number it was proposed as; ``repeat_of``: the configuration it
        measured again)."""
        if result.name in self._ledger.results:
            return
        if result.name not in self._ledger.pending:
            self._budget.replayed(result)
        if self._model_search is not None and result.name not in self._ledger.entries:
            # A configuration the cost model proposed, told from history: known by its key.
            key = self._model_search.key_of(result.name)
            if key is not None:
                self._catalog.register(*key)
        self._catalog.register_size_run(result.name)
        self._ledger.record(result, number, repeat_of)
        self._bounds.note(result.name)
        if self._search is not None:
            self._search.tell(result)

    def _start(self, candidate: Candidate) -> Candidate:
        """Hand ``candidate`` out: its trial asked (an owed one's taken up again), numbered
        as the trial is."""
        trial = self._ledger.trial(candidate.name)
        owed = trial.number if trial is not None and trial.state is LedgerState.proposed else None
        params, dists = self._trial_params(candidate.name)
        attrs = {PHASE_ATTR: candidate.phase.value, REPEAT_OF_ATTR: candidate.repeat_of}
        number = self._trials.start(candidate.name, params, dists, attrs, number=owed)
        return self._ledger.propose(candidate, number)

    def _trial_params(self, name: str) -> tuple[dict[str, Any], dict[str, Any]]:
        """The trial parameters of the configuration experiment ``name`` measures (none for
        a name outside the space)."""
        base = self._ledger.config_of(name)
        entry = self._ledger.entries.get(base)
        key = None
        if entry is not None:
            key = (entry.variant, entry.micro_batch_size, entry.knobs)
        elif self._model_search is not None and (known := self._model_search.key_of(base)):
            key = known
        elif base in self._catalog.size_names:
            key = (*self._catalog.size_names[base], ())
        if key is None:
            return {}, {}
        return self._catalog.space.trial_params(*key)

    num_replayed = 0
    """Finished experiments the study held when the tuner was made (a resumed run's)."""

    @property
    def study(self) -> optuna.Study:
        """The study that records the run: one trial per experiment."""
        return self._trials.study

    def summary(self) -> TuningSummary:
        """What the run found so far (complete once ``finished``)."""
        return summarize(
            self._ledger,
            self._catalog.space,
            self._tuning,
            not_run=self._not_run(),
            tuning_time_s=self.elapsed_s,
            stop=self._stop,
            noise=self._remeasure.noise(),
            noise_measured=self._remeasure.noise_measured(),
            cost_model=self.cost_model(),
        )

    def cost_model(self) -> CostModel | None:
        """``model_based``'s cost model, fitted to the results so far (None for the other
        tuner types, and before the workload's size is known)."""
        return self._model_search.fitted() if self._model_search is not None else None

    def predicted(self, names: Iterable[str]) -> dict[str, float]:
        """``model_based``'s prediction of the metric for each configuration named, from
        what ran so far (empty for the other tuner types, and before the workload's size is
        known)."""
        if self._model_search is None:
            return {}
        return self._model_search.predicted(list(names))

    def optimal_config(self) -> dict[str, Any] | None:
        """The user's config with the best values, ``autotuning`` removed, batch triad resolved.

        None when no experiment ran ok.
        """
        best = self.summary().best
        if best is None:
            return None
        return self._ds_config(self._ledger.entries[best.name].overrides)

    # --- choosing the next experiment ---------------------------------------------------------

    def _next_name(self) -> str | None:
        """The next name the current phase wants run, or None if it has nothing now."""
        # A re-measurement an interrupted run had running comes first, as it would have
        # finished first.
        owed = (n for n in self._ledger.owed() if self._ledger.is_repeat(n))
        if (name := next(owed, None)) is not None:
            return name
        if self._phase is Phase.remeasure:
            return self._next_repeat()
        if self._search_budget_spent():
            return None
        if (control := self._remeasure.control_due(self._is_open_repeat)) is not None:
            return control
        if self._phase is Phase.max_micro_batch:
            return self._sizes.next_owed() or self._sizes.next()
        if self._phase is Phase.model:
            return self._next_predicted()
        if self._search is None:  # nothing to tune in this phase
            return None
        # What an interrupted run had running comes first, as it would have finished first.
        owed = (n for n in self._ledger.owed() if n in self._search)
        if (name := next(owed, None)) is not None:
            return name
        if self._patience_spent():  # until a result in flight brings a new best, if one does
            return None
        return self._search.ask(self._catalog.is_open)

    def _next_predicted(self) -> str | None:
        """``model_based``: what an interrupted run had running, then the cost model's pick
        (before the workload's size is known, the first size of the memory search)."""
        search = self._model_search
        assert search is not None
        for name in self._ledger.owed():
            key = search.key_of(name)
            if key is not None:
                self._catalog.register(*key)
                return name
            if name in self._catalog.size_names:
                self._catalog.register_size_run(name)
                return name
        if self._patience_spent():
            return None
        if (answer := self._next_warm_answer()) is not None:
            return answer
        if search.fitted() is None:
            return self._sizes.next()
        ranking = self._ledger.ranked(self._ledger.results.values(), self._tuning.metric)
        chosen = search.next(ranking[0] if ranking else None)
        if chosen is None and self._ledger.pending:
            return None  # what is in flight may still change the model's mind
        if chosen is None:
            # Nothing beats the best on its one measurement, perhaps a lucky one: the control
            # first if it is due (the noise it shows decides the rest), then the best again
            # if a second measurement could change the answer; the model then decides again.
            remeasure = self._remeasure
            return remeasure.control_due(
                self._is_open_repeat, every=CONTROL_AT_END
            ) or remeasure.confirmation(self._is_open_repeat)
        key = search.key_of(chosen)
        assert key is not None
        self._catalog.register(*key)
        return chosen

    def _next_warm_answer(self) -> str | None:
        """The next earlier answer (:class:`WarmStart`) this space holds and that may run;
        each is offered once."""
        search = self._model_search
        assert search is not None
        space = self._catalog.space
        while self._warm_answers:
            answer = self._warm_answers.pop(0)
            name = space.name({**space.fixed, **answer})
            key = search.key_of(name)
            if key is not None and self._catalog.is_open(self._catalog.register(*key)):
                return name
        return None

    def _phase_end_reason(self) -> StopReason | None:
        """Why the phase that has nothing more to propose ended: a limit it reached, or None
        where it ran all it had."""
        if self._phase is Phase.remeasure:
            return None
        if self._search_budget_spent():
            return StopReason(StopKind.trial_cap, (self._tuning.tuner_num_trials,))
        if self._searching() and self._patience_spent():
            return StopReason(StopKind.no_better, (self._tuning.tuner_early_stopping,))
        if self._phase is Phase.model and self._ledger.results:
            return StopReason(StopKind.model_converged, (TOLERANCE,))
        return None

    def _searching(self) -> bool:
        return self._search is not None or self._phase is Phase.model

    def _advance(self) -> None:
        """End the current phase (keeping why, if a limit ended it) and move to the next
        phase that has something to do."""
        reason = self._phase_end_reason()
        if reason is not None:
            self._stop = reason
        self._note_unreached(NotRunReason(NotRunKind.not_reached, stop=reason))
        self._search = None
        if self._phase is Phase.model:
            self._note_unsearched_variants()
        self._phase = self._phases[self._phases.index(self._phase) + 1]
        if self._phase is Phase.micro_batch:
            self._start_micro_batch_phase()
        elif self._phase is Phase.knobs:
            self._start_knob_phase()
        elif self._phase is Phase.done and self._stop is None:
            self._stop = StopReason(StopKind.exhausted)

    def _note_unsearched_variants(self) -> None:
        """Why each variant with nothing that ran ok has none: never run is not the same as
        nothing fits (the trial cap or the time budget can end the search before it)."""
        ran = {
            entry.variant
            for name, entry in self._ledger.entries.items()
            if name in self._ledger.results
        }
        for plan in self._catalog.space.plans:
            if self._ledger.best_score(plan.variant, self._tuning.metric) is not None:
                continue
            kind = NotRunKind.none_fit if plan.variant in ran else NotRunKind.not_searched
            reason = NotRunReason(kind)
            self._ledger.rule_out_variant(plan.variant.label, reason, replace_reason=False)

    def _start_micro_batch_phase(self) -> None:
        self._note_unsearched_variants()
        subspaces, names = [], {}
        for plan in self._catalog.space.plans:
            largest = self._ledger.largest_fit(plan.variant)
            if largest is None:
                continue
            # Largest first: the grid tries large micro-batches (usually fastest) first.
            sizes = plan.compared_sizes(largest)
            subspace = Subspace(plan.variant.label, ((MICRO_BATCH_KEY, sizes),))
            subspaces.append(subspace)
            for point in subspace.points():
                names[point] = self._catalog.register(
                    plan.variant, point.as_dict()[MICRO_BATCH_KEY], ()
                )
        self._start_search(subspaces, names)

    def _start_knob_phase(self) -> None:
        subspaces, names = [], {}
        for plan in self._catalog.space.plans:
            size = best_micro_batch(plan, self._ledger, self._tuning)
            if size is None or not plan.knobs:
                continue
            subspace = Subspace(plan.variant.label, plan.knobs)
            subspaces.append(subspace)
            for point in subspace.points():
                names[point] = self._catalog.register(plan.variant, size, point.values)
        self._start_search(subspaces, names)

    def _start_search(self, subspaces: list[Subspace], names: dict[Point, str]) -> None:
        if not subspaces:
            return
        self._stop = None  # each search phase ends for its own reason
        self._search = PhaseSearch(self._phase, subspaces, names, self._tuning, self._ledger)

    def _next_repeat(self) -> str | None:
        """The re-measurement worth running next (:class:`Remeasurement`), if the trial cap
        and the time budget have room for it; one the budget has no room for is noted and
        ends the phase."""
        if self._ledger.pending:
            return None  # each re-measurement is decided on every result before it
        if self._trials_left() <= 0:
            if self._stop is None:
                self._stop = StopReason(StopKind.trial_cap, (self._tuning.tuner_num_trials,))
            return None
        name = self._remeasure.next(self._is_open_repeat)
        if name is None or self._fits_time_budget(name):
            return name
        self._stop = self._time_stop(StopKind.time_budget)
        self._ledger.leave_unreached(name, NotRunReason(NotRunKind.time_budget, stop=self._stop))
        return None

    def _is_open_repeat(self, name: str) -> bool:
        return self._ledger.is_undecided(name)

    # --- the time budget ----------------------------------------------------------------------

    def _fits_time_budget(self, name: str) -> bool:
        """Whether ``name`` ends within ``time_budget_s`` (:class:`TimeBudget`), while the
        search goes on with room to measure the best again while it is in doubt."""
        searching = self._phase is not Phase.remeasure
        best = self._remeasure.doubted_leader() if searching else None
        return self._budget.fits(name, keep_for=best)

    def _end_search_for_time(self, name: str) -> None:
        """The search's next experiment would not end in time: what is left of the budget
        goes to re-measuring what the search found."""
        kept = self._tuning.num_remeasure > 0
        kind = StopKind.time_budget_kept if kept else StopKind.time_budget
        stop = self._time_stop(kind)
        if self._search is not None:
            self._search.drop(name)
        not_run = NotRunReason(NotRunKind.time_budget, stop=stop)
        self._ledger.leave_unreached(name, not_run, replace_reason=True)
        self._note_unreached(NotRunReason(NotRunKind.not_reached, stop=stop))
        self._stop = stop
        self._search = None
        self._phase = Phase.remeasure

    def _time_stop(self, kind: StopKind) -> StopReason:
        seconds = self._budget.seconds
        assert seconds is not None, "only a time budget ends the search for time"
        return StopReason(kind, (seconds,))

    def _run_end_reason(self) -> StopReason | None:
        """Why the whole run ends now, whatever phase it is in; None: it goes on."""
        if self._budget.spent:
            return self._time_stop(StopKind.time_budget_spent)
        if (error := self._bounds.same_failure()) is not None:
            return StopReason(StopKind.same_failure, (SAME_FAILURE_LIMIT, error))
        if (steps := self._bounds.step_limit()) is not None:
            return StopReason(StopKind.step_limit, (steps, self._tuning.end_profile_step))
        return None

    def _finish(self, reason: StopReason) -> None:
        self._note_unreached(NotRunReason(NotRunKind.not_reached, stop=reason))
        self._phase, self._search, self._stop = Phase.done, None, reason

    def _note_unreached(self, reason: NotRunReason) -> None:
        """Why the current phase's configurations that never ran did not (for the summary)."""
        for name in self._search.points if self._search is not None else ():
            if self._ledger.is_free(name):
                self._ledger.leave_unreached(name, reason)

    # --- bookkeeping --------------------------------------------------------------------------

    def _candidate(self, name: str) -> Candidate | None:
        """The experiment for ``name``; None (and pruned) if its config breaks a rule."""
        base = self._ledger.config_of(name)
        entry = self._ledger.entries[base]
        try:
            ds_config = self._ds_config(entry.overrides)
        except ConfigError as err:
            self._ledger.rule_out(name, NotRunReason(NotRunKind.config_rule, (str(err),)))
            if self._search is not None:
                self._search.drop(name)
            return None
        repeat = base != name
        return Candidate(
            name=name,
            overrides=entry.overrides,
            ds_config=ds_config,
            phase=self._phase,
            repeat_of=base if repeat else None,
            stop_above_step_s=None if repeat else self._loser_step_s(ds_config),
        )

    def _loser_step_s(self, ds_config: Mapping[str, Any]) -> float | None:
        """The step time above which a configuration run at ``ds_config`` cannot come within
        the tolerance of the best so far, with :data:`LOSER_MARGIN` to spare (None: no best
        yet, or the metric's value per step is unknown)."""
        ranking = self._ledger.ranked(self._ledger.results.values(), self._tuning.metric)
        if not ranking or ranking[0].disturbed:
            return None
        best, metric = ranking[0].value, self._tuning.metric
        margin = 1.0 + LOSER_MARGIN
        if metric is Metric.latency:
            return best * (1.0 + TOLERANCE) * margin
        if metric is Metric.throughput:
            per_step = float(ds_config.get("train_batch_size") or 0)
        elif self._model_info is not None:  # FLOPS per rank
            micro = int(ds_config.get("train_micro_batch_size_per_gpu") or 0)
            steps = int(ds_config.get("gradient_accumulation_steps") or 1)
            per_step = self._model_info.flops_per_sample * micro * steps
        else:
            return None
        if per_step <= 0 or best <= 0:
            return None
        return per_step / (best * (1.0 - TOLERANCE)) * margin

    def _ds_config(self, overrides: Mapping[str, Any]) -> dict[str, Any]:
        ds_config = self._config.with_overrides(overrides).to_dict()
        ds_config.pop("autotuning", None)
        return ds_config

    def _not_run(self) -> dict[str, NotRunReason]:
        """Every variant, bound and configuration the tuner considered and did not run, with
        the reason: pruned (memory estimate, an ``oom`` below it, the data bound, a config
        rule), not reached (the phase or the run ended first, and why), or, with
        ``model_based``, predicted not to beat the best (one line per variant)."""
        ledger = self._ledger
        explained = {
            **ledger.ruled_out_variants,
            **{t.name: t.reason for t in ledger.not_run() if t.final and t.reason is not None},
            **failed_sizes_bound(self._catalog.space.plans, ledger),
            **self._bounds.pruned(),
        }
        ended = NotRunReason(NotRunKind.search_ended, stop=self._stop)
        for name, entry in ledger.entries.items():
            if not ledger.is_free(name) or name in explained:
                continue
            trial = ledger.trial(name)
            if trial is not None and trial.reason is not None:
                explained[name] = trial.reason
            else:
                explained[name] = ledger.ruled_out_variants.get(entry.variant.label, ended)
        if self._model_search is not None and self._phase is Phase.done:
            for label, count in self._model_search.unmeasured().items():
                if label not in explained:
                    explained[f"{label}: {count} configurations"] = NotRunReason(
                        NotRunKind.not_measured, stop=self._stop
                    )
        return explained

    def _trials_left(self) -> int:
        """Experiments ``tuner_num_trials`` still allows, those in flight counted as run."""
        spent = len(self._ledger.results) + len(self._ledger.pending)
        return self._tuning.tuner_num_trials - spent

    def _search_budget_spent(self) -> bool:
        """Whether the search may start no more experiments: the cap reached, but for one
        kept for measuring the best again while it is in doubt."""
        left = self._trials_left()
        if left != 1:  # the doubt (a ranking and the noise) is weighed only at the last slot
            return left <= 0
        return self._remeasure.doubted_leader() is not None

    def _patience_spent(self) -> bool:
        if self._phase is Phase.model and self._model_search is not None:
            names: Container[str] = self._model_search
        else:
            names = self._search.points if self._search is not None else {}
        since = experiments_since_best(
            self._ledger,
            names,
            self._tuning.metric,
            knobs_later=self._phase is Phase.micro_batch,
            failures_count=self._phase is not Phase.model,
        )
        return since >= self._tuning.tuner_early_stopping


def _study_in_memory(tuning: AutotuningConfig) -> optuna.Study:
    """A study of the run in this process only (no storage)."""
    return new_study(tuning.metric, tuning.seed)


def _model_shape(model_info: ModelInfo | None) -> ModelShape | None:
    """What the cost model needs of the workload (None: not known yet)."""
    if model_info is None or model_info.flops_per_sample <= 0:
        return None
    return ModelShape(model_info.num_params, model_info.flops_per_sample)
