"""The tuner: decides what to run next and when to stop, behind ask/tell. It runs nothing.

A run is a search, then re-measurement. The search is the tuner type's
(:mod:`autotune.tuner.search`), in its phases: ``model_based`` (the default) predicts every
configuration with a cost model fitted to what ran and measures the most promising, in one
phase (``model``); ``gridsearch`` and ``random`` follow DeepSpeed's flow (``max_micro_batch``,
``micro_batch``, ``knobs``); an Optuna sampler the user passes proposes over the whole space
(``sampler``). Then ``remeasure`` (:mod:`autotune.tuner.remeasure`): a configuration is
measured again only where another measurement could change the answer.

The run's record is an Optuna study (:mod:`autotune.tuner.trials`): every experiment the
tuner proposes is a trial asked of it, the search being the study's sampler, and every result
is told to it. A tuner made on a study that holds trials (a resumed run) replays them first,
in the order they were proposed, those left running owed a run in their places: every
decision derives from the results told, so it continues as the interrupted run would have.

Failures bound the rest of the space (:mod:`autotune.tuner.bounds`): an ``oom`` prunes every
larger micro-batch with the same stage and knobs, a script that ran out of data every larger
micro-batch in every variant. When the search and the run end, and why, is
:class:`~autotune.tuner.stopping.Stopping`'s: the trial cap, early stopping, the time budget,
the same failure again and again, a script's own step limit. Once something ran ok, a search
experiment carries the step time above which it cannot come within the tolerance of the best
(:attr:`Candidate.stop_above_step_s`): a loser is stopped after its first timed steps.

Several experiments may be in flight at once. ``ask`` then returns None both when the search
is over and when the next proposal needs a result first (the end of a phase, the next step of
a micro-batch descent, early stopping that in-flight results may still settle): ``finished``
tells the two apart. The trial cap and early stopping count experiments in flight, so a run
with several at once proposes exactly what a one-at-a-time run would (given the same results).

A script's model is unknown until an experiment measures it: :meth:`Tuner.learn_model` then
brings in the memory estimate and the cost model for what is not yet decided, keeping
everything run, running or owed (ranked even where the estimate would now prune it). A tuner
that knew the model from the start, told the same results, decides alike, so a resumed script
run needs no replay of when the model was learnt.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

from autotune.config import Config, ConfigError, Metric, TunerType
from autotune.experiment import ExperimentResult
from autotune.tuner.bounds import Bounds
from autotune.tuner.budget import TimeBudget
from autotune.tuner.candidate import Candidate, Phase
from autotune.tuner.catalog import Catalog
from autotune.tuner.cost_model import CostModel
from autotune.tuner.hardware import CPU_RANK, Hardware
from autotune.tuner.ledger import Ledger
from autotune.tuner.ledger import TrialState as LedgerState
from autotune.tuner.probe import SizeSearch, failed_sizes_bound
from autotune.tuner.ranking import TOLERANCE
from autotune.tuner.reasons import NotRunKind, NotRunReason, StopKind, StopReason
from autotune.tuner.remeasure import (
    ARRIVED_WAIT_SHARE,
    MIN_QUIET_WAIT_S,
    QUIET_WAIT_SHARE,
    Remeasurement,
)
from autotune.tuner.search import (
    ModelBasedSearch,
    PhasedSearch,
    SamplerSearch,
    Search,
    SearchContext,
)
from autotune.tuner.space import build_space
from autotune.tuner.stopping import Stopping
from autotune.tuner.summary import TuningSummary, summarize
from autotune.tuner.trials import (
    PHASE_ATTR,
    REPEAT_OF_ATTR,
    TrialLog,
    fail_unnamed,
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
        sampler: an Optuna sampler to search with instead of the tuner type's (any
            ``optuna.samplers.BaseSampler``: TPE, GP, CMA-ES, ...).
        busy_before_start: whether other processes held the node's cores before the first
            experiment (None: not known). A neighbour that came during the run is waited for
            longer (see :attr:`quiet_wait_s`).

    Raises:
        ConfigError: if the batch limits leave no micro-batch size.

    Example:
        >>> from autotune.config import load_config
        >>> tuner = Tuner(load_config({"zero_optimization": {"stage": 1}}, world_size=2))
        >>> candidate = tuner.ask()
        >>> candidate.name, candidate.phase.value
        ('z1_mbs1024', 'model')
        >>> tuner.study.trials[0].params
        {'zero_stage': 1, 'micro_batch_size': 1024}

        A driver runs it and tells the result, until ``ask`` returns None with nothing in
        flight::

            while (candidate := tuner.ask()) is not None:
                tuner.tell(runner.run(spec_for(candidate)))
            summary, best = tuner.summary(), tuner.optimal_config()
    """

    num_replayed = 0
    """Finished experiments the study held when the tuner was made (a resumed run's)."""

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
        sampler: optuna.samplers.BaseSampler | None = None,
        busy_before_start: bool | None = None,
    ) -> None:
        self._config = config
        self._busy_before_start = busy_before_start
        self._tuning = tuning = config.autotuning
        if device_memory_bytes is None:
            device_memory_bytes = config.device_memory_bytes
        self._device_memory_bytes = device_memory_bytes
        self._model_info = model_info
        self._ledger = ledger = Ledger()
        self._bounds = Bounds(ledger)
        self._remeasure = Remeasurement(ledger, tuning)
        self._budget = TimeBudget(ledger, tuning.time_budget_s, clock, started)
        self._stopping = Stopping(ledger, tuning, self._bounds, self._budget, self._remeasure)
        space = build_space(config, model_info, device_memory_bytes)
        self._catalog = Catalog(ledger, self._bounds, space)
        sizes = SizeSearch(self._catalog, ledger, self._bounds, tuning)
        sizes.order(space, model_info)
        self._sizes = sizes
        if model_info is not None and space.pruned:
            # What a run that did not know the model yet may have tried (a script's first
            # experiments), so that their results, told from history, are ranked too.
            self._catalog.add_size_names(build_space(config, None, device_memory_bytes))
        self._trials = TrialLog(study or new_study(tuning.metric, tuning.seed), tuning.metric)
        context = SearchContext(
            config, ledger, self._catalog, self._bounds, self._remeasure, self._stopping, sizes
        )
        self._model_based: ModelBasedSearch | None = None
        self._search: Search
        if sampler is not None:
            self._search = SamplerSearch(context, self._trials.study)
            self._trials.study.sampler = sampler
        elif TunerType(tuning.tuner_type) is TunerType.model_based:
            self._search = self._model_based = ModelBasedSearch(
                context,
                hardware or CPU_RANK,
                ranks_per_node or config.world_size,
                model_info,
                warm_start,
            )
            self._trials.study.sampler = self._search
        else:
            self._search = PhasedSearch(context)
            self._trials.study.sampler = self._search
        self._phases = (*self._search.phases, Phase.remeasure, Phase.done)
        self._phase = self._phases[0]
        self._params: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {}  # by configuration
        self._quiet_wait_s: float | None = None  # asked of the caller now (quiet_wait_s)
        self._waited_s = 0.0  # for a quiet machine, all waits together
        self._stayed_busy = False  # a wait ended with the machine still busy
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

    @property
    def study(self) -> optuna.Study:
        """The study that records the run: one trial per experiment."""
        return self._trials.study

    def ask(self) -> Candidate | None:
        """The next experiment to run, or None: finished, or waiting for results in flight.

        Several candidates may be in flight at once; a phase ends only once all its results
        are in, so None with candidates pending means "tell me something first".
        """
        if self._phase is not Phase.done and (reason := self._stopping.run_end()) is not None:
            self._finish(reason)
        while self._phase is not Phase.done:
            name = self._next_name()
            if name is None:
                if self._ledger.pending or self._quiet_wait_s is not None:
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

    @property
    def quiet_wait_s(self) -> float | None:
        """After ``ask`` returned None with nothing in flight: the seconds to wait at most
        for the machine to quiet down, then say how it went (:meth:`machine_quiet`) and ask
        again; None: the run is done. Asked for where a machine busy throughout measured
        what would otherwise be measured again (see :mod:`autotune.tuner.remeasure`)."""
        return self._quiet_wait_s

    def machine_quiet(self, quiet: bool, waited_s: float) -> None:
        """How the wait :attr:`quiet_wait_s` asked for went: the machine was seen quiet
        after ``waited_s`` (what the busy machine decided is measured again), or it stayed
        busy (the answer stands on what was measured; no more waiting)."""
        self._quiet_wait_s = None
        self._waited_s += waited_s
        if quiet:
            self._remeasure.quiet_seen()
        else:
            self._stayed_busy = True

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
        self._search.learn_model(space, model_info)

    def summary(self) -> TuningSummary:
        """What the run found so far (complete once ``finished``)."""
        return summarize(
            self._ledger,
            self._catalog.space,
            self._tuning,
            not_run=self._not_run(),
            tuning_time_s=self.elapsed_s,
            stop=self._stopping.reason,
            noise=self._remeasure.noise(),
            noise_measured=self._remeasure.noise_measured(),
            cost_model=self.cost_model(),
            waited_for_quiet_s=self._waited_s,
        )

    def cost_model(self) -> CostModel | None:
        """``model_based``'s cost model, fitted to the results so far (None for the other
        tuner types, and before the workload's size is known)."""
        return self._model_based.fitted() if self._model_based is not None else None

    def predicted(self, names: Iterable[str]) -> dict[str, float]:
        """``model_based``'s prediction of the metric for each configuration named, from
        what ran so far (empty for the other tuner types, and before the workload's size is
        known)."""
        if self._model_based is None:
            return {}
        return self._model_based.predicted(list(names))

    def optimal_config(self) -> dict[str, Any] | None:
        """The user's config with the best values, ``autotuning`` removed, batch triad resolved.

        None when no experiment ran ok.
        """
        best = self.summary().best
        if best is None:
            return None
        return self._ds_config(self._ledger.entries[best.name].overrides)

    # --- the record ---------------------------------------------------------------------------

    def _replay(self, study: optuna.Study) -> None:
        """Tell what ``study`` holds of an earlier run, in the order it was proposed: the
        finished experiments, and those left running, owed a run with their numbers (until
        run again they count as in flight for early stopping, and their phase proposes them
        before anything new, so the resumed run decides as the interrupted one would have)."""
        fail_unnamed(study)
        for past in past_experiments(study.get_trials(deepcopy=False)):
            self._params.setdefault(past.repeat_of or past.name, (past.params, past.dists))
            if past.result is None:
                self._ledger.owe(past.name, past.number, past.repeat_of)
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
        if self._model_based is not None:
            self._model_based.known(result.name)
        self._catalog.register_size_run(result.name)
        self._ledger.record(result, number, repeat_of)
        self._bounds.note(result.name)
        self._search.tell(result)

    def _start(self, candidate: Candidate) -> Candidate:
        """Hand ``candidate`` out: its trial asked (of the search, as the study's sampler,
        for a search proposal; with its configuration's parameters fixed for a
        re-measurement; an owed one's taken up again), numbered as the trial is."""
        trial = self._ledger.trial(candidate.name)
        owed = trial.number if trial is not None and trial.state is LedgerState.proposed else None
        params, dists = self._trial_params(candidate.name)
        attrs = {PHASE_ATTR: candidate.phase.value, REPEAT_OF_ATTR: candidate.repeat_of}
        asked = None
        sampled = (
            owed is None and candidate.repeat_of is None and self._phase is not Phase.remeasure
        )
        if sampled and isinstance(self._search, SamplerSearch):
            asked = self._search.asked(candidate.name)
            if asked is not None:
                params, dists = dict(asked.params), dict(asked.distributions)
        elif sampled:
            self._search.propose(params, dists)
        number = self._trials.start(
            candidate.name, params, dists, attrs, number=owed, trial=asked, sampled=sampled
        )
        self._params.setdefault(candidate.repeat_of or candidate.name, (params, dists))
        return self._ledger.propose(candidate, number)

    def _trial_params(self, name: str) -> tuple[dict[str, Any], dict[str, Any]]:
        """The trial parameters of the configuration experiment ``name`` measures: its first
        trial's where it has one, else from the space (none for a name outside it)."""
        base = self._ledger.config_of(name)
        if base in self._params:
            return self._params[base]
        entry = self._ledger.entries.get(base)
        if entry is None:
            key = self._catalog.size_names.get(base)
            if key is None:
                return {}, {}
            return self._catalog.space.trial_params(*key, ())
        return self._catalog.space.trial_params(entry.variant, entry.micro_batch_size, entry.knobs)

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
        if self._stopping.search_capped():
            return None
        if (control := self._remeasure.control_due(self._ledger.is_undecided)) is not None:
            return control
        return self._search.next(self._phase)

    def _advance(self) -> None:
        """End the current phase (keeping why, if a limit ended it) and move to the next
        phase that has something to do."""
        phase = self._phase
        reason = self._stopping.phase_end(phase, self._search.patience(phase))
        self._stopping.ended(reason)
        self._note_unreached(NotRunReason(NotRunKind.not_reached, stop=reason))
        if phase in self._search.phases:
            self._search.end(phase)
        self._phase = self._phases[self._phases.index(phase) + 1]
        if self._phase in self._search.phases:
            self._search.begin(self._phase)
        elif self._phase is Phase.done:
            self._stopping.exhausted()

    def _next_repeat(self) -> str | None:
        """The re-measurement worth running next (:class:`Remeasurement`), if the trial cap
        and the time budget have room for it; one the budget has no room for is noted and
        ends the phase."""
        if self._ledger.pending:
            return None  # each re-measurement is decided on every result before it
        if self._stopping.trials_left() <= 0:
            if self._stopping.reason is None:
                cap = StopReason(StopKind.trial_cap, (self._tuning.tuner_num_trials,))
                self._stopping.ended(cap)
            return None
        name = self._remeasure.next(self._ledger.is_undecided)
        if name is None:
            self._quiet_wait_s = self._quiet_wait()
            return None
        if self._fits_time_budget(name):
            return name
        stop = self._stopping.time(StopKind.time_budget)
        self._stopping.ended(stop)
        self._ledger.leave_unreached(name, NotRunReason(NotRunKind.time_budget, stop=stop))
        return None

    def _quiet_wait(self) -> float | None:
        """How long to wait for a quiet machine before declaring what a busy one measured
        (a share of the run so far, larger where the node was quiet before the run began:
        see :data:`~autotune.tuner.remeasure.QUIET_WAIT_SHARE`; within the time budget), or
        None: nothing to wait for."""
        if self._stayed_busy or not self._remeasure.waits_for_quiet():
            return None
        share = QUIET_WAIT_SHARE if self._busy_before_start is not False else ARRIVED_WAIT_SHARE
        seconds = share * self._budget.elapsed_s - self._waited_s
        if self._budget.seconds is not None:
            seconds = min(seconds, self._budget.seconds - self._budget.elapsed_s)
        return seconds if seconds >= MIN_QUIET_WAIT_S else None

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
        stop = self._stopping.time(StopKind.time_budget_kept if kept else StopKind.time_budget)
        self._search.drop(name)
        not_run = NotRunReason(NotRunKind.time_budget, stop=stop)
        self._ledger.leave_unreached(name, not_run, replace_reason=True)
        self._note_unreached(NotRunReason(NotRunKind.not_reached, stop=stop))
        self._stopping.ended(stop)
        if self._phase in self._search.phases:
            self._search.end(self._phase)
        self._phase = Phase.remeasure

    def _finish(self, reason: StopReason) -> None:
        self._note_unreached(NotRunReason(NotRunKind.not_reached, stop=reason))
        if self._phase in self._search.phases:
            self._search.end(self._phase)
        self._phase = Phase.done
        self._stopping.ended(reason)

    def _note_unreached(self, reason: NotRunReason) -> None:
        """Why the current phase's configurations that never ran did not (for the summary)."""
        for name in self._search.points(self._phase):
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
        ended = NotRunReason(NotRunKind.search_ended, stop=self._stopping.reason)
        for name, entry in ledger.entries.items():
            if not ledger.is_free(name) or name in explained:
                continue
            trial = ledger.trial(name)
            if trial is not None and trial.reason is not None:
                explained[name] = trial.reason
            else:
                explained[name] = ledger.ruled_out_variants.get(entry.variant.label, ended)
        if self._phase is Phase.done:
            for key, reason in self._search.not_measured(self._stopping.reason).items():
                if key.split(":")[0] not in explained:
                    explained[key] = reason
        return explained
