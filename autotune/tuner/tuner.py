"""The driver: Optuna's ask and tell over autotune's samplers, with what autotune adds.

Each :meth:`Tuner.ask` reads the study (:class:`~autotune.tuner.history.History`) and what
the run recorded beside it (:class:`~autotune.tuner.record.RunRecord`): a run that is over
proposes nothing; an experiment a killed run left running runs again first, in its place;
else :class:`~autotune.tuner.stopping.Stopping`, the one place every stop is decided, takes
the step from the sampler's decision while the search runs (:mod:`autotune.tuner.samplers`)
and from re-measurement once it is over (:mod:`autotune.tuner.remeasure`: trials queued
with their configuration's parameters and ``repeat_of``). Losers stop at
:class:`~autotune.tuner.pruner.LoserPruner`'s limit. A resumed run decides as the
interrupted one would have, and several in flight propose what one at a time would.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from autotune.config import Config
from autotune.experiment import ExperimentResult
from autotune.tuner import record
from autotune.tuner.budget import RunClock
from autotune.tuner.candidate import Candidate, Decision, Phase, Step, StepKind
from autotune.tuner.history import Experiment, History
from autotune.tuner.pruner import LoserPruner
from autotune.tuner.reasons import StopReason
from autotune.tuner.record import QuietWait, RunRecord
from autotune.tuner.samplers import ModelBasedSampler, StudySampler, make_sampler
from autotune.tuner.search import SamplerSearch, Search, SearchContext
from autotune.tuner.search.sampler import ask_sampler
from autotune.tuner.search_space import SearchSpace
from autotune.tuner.stopping import Stopping
from autotune.tuner.summary import TuningSummary, summarize
from autotune.tuner.trials import new_study

if TYPE_CHECKING:
    import optuna

    from autotune.profiling.model_info import ModelInfo
    from autotune.tuner.cost_model import CostModel
    from autotune.tuner.hardware import Hardware
    from autotune.tuner.warm_start import WarmStart


class Tuner:
    """Proposes experiments (:meth:`ask`) and records their results (:meth:`tell`) in an
    Optuna study until the run is over (see the module docstring).

    Args:
        config: the user's config, search lists and ``autotuning`` section included.
        model_info: the workload's sizes (None: a script's, measured by its experiments).
        device_memory_bytes: per-rank device budget (default: the config's).
        study: the run's study (a resumed run goes on from what it holds; None: in memory).
        clock, started: seconds, monotonic, and the reading ``time_budget_s`` counts from.
        hardware, ranks_per_node, warm_start: :class:`~autotune.samplers.ModelBasedSampler`'s.
        sampler: any Optuna sampler to search with instead of the tuner type's.
        busy_before_start: whether a neighbour held the node's cores before the first
            experiment (None: not known): one that came later is waited for longer.

    Example:
        >>> from autotune.config import load_config
        >>> tuner = Tuner(load_config({"zero_optimization": {"stage": 1}}, world_size=2))
        >>> candidate = tuner.ask()
        >>> candidate.name, candidate.phase.value
        ('z1_mbs1024', 'model')
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
        sampler: optuna.samplers.BaseSampler | None = None,
        busy_before_start: bool | None = None,
    ) -> None:
        tuning = config.autotuning
        self.space = SearchSpace(config, device_memory=device_memory_bytes, model_info=model_info)
        self.study = study or new_study(tuning.metric, tuning.seed)
        self.sampler = sampler or make_sampler(
            self.space, tuning.tuner_type, None, hardware, ranks_per_node, warm_start
        )
        self.pruner = LoserPruner(self.space)
        self.study.sampler, self.study.pruner = self.sampler, self.pruner
        self.search: Search = getattr(self.sampler, "search", None) or SamplerSearch()
        self.phase: Phase = self.search.phases[0]
        self._busy = busy_before_start
        self._open: dict[str, tuple[optuna.Trial, Candidate]] = {}  # in flight, by name
        self._quiet_wait_s: float | None = None
        record.settle_stale(self.study, self.space)
        replayed = frozenset(self.history().results)
        self.num_replayed = len(replayed)
        self._clock = RunClock(clock, clock() if started is None else started, None, replayed)

    # --- the loop -----------------------------------------------------------------------------

    def ask(self) -> Candidate | None:
        """The next experiment to run, or None: the run is over (:attr:`finished`), or it
        waits for results in flight, or for a quiet machine (:attr:`quiet_wait_s`)."""
        history, run = self.history(), RunRecord.of(self.study)
        rules = self._rules(history, run)
        if not run.run_ended and (stop := rules.run_end()) is not None:
            run = self._end(record.RUN_END_ATTR, stop)
        if run.run_ended:
            self.phase = Phase.done
            return None
        if (owed := rules.owed(self._open)) is not None:  # in its place: it would have ended first
            phase = Phase(owed.phase) if owed.phase else self.phase
            step = Step(StepKind.run, phase, owed.name, owed.entry, owed.repeat_of)
            return self._start(history, step, owed=owed)
        decision, context = self._decide(history)
        if not run.search_ended:
            step = rules.search_step(decision)
            if step.kind is StepKind.end_search:
                run = self._end(record.SEARCH_END_ATTR, step.stop, step.left)
        if run.search_ended:
            step = rules.remeasure_step(run)
        self.phase = step.phase
        if step.kind is StepKind.run:
            return self._start(history, step)
        if step.kind is StepKind.ask:  # the user's sampler: asked until it suggests one
            if (asked := ask_sampler(self.study, self.space, context)) is not None:
                trial, entry = asked
                step = Step(StepKind.run, step.phase, self.space.name_of(entry), entry)
                return self._start(history, step, trial=trial)
            self._end(record.SEARCH_END_ATTR, SamplerSearch.exhausted(context).stop)
        elif step.kind is StepKind.quiet:
            self._quiet_wait_s = step.wait_s
        elif step.kind is StepKind.end_run:
            self._end(record.RUN_END_ATTR, step.stop, step.left)
        return None

    def tell(self, result: ExperimentResult) -> None:
        """Record a finished experiment of any status (its trial's tell is the commit point);
        one not asked for is added as a finished trial; a name told twice keeps the first."""
        if result.name in self._open:
            trial, candidate = self._open.pop(result.name)
            metric = self.space.config.autotuning.metric
            record.finish(self.study, trial, result, candidate.ds_config, metric)
        elif result.name not in self.history().results:
            record.add_result(self.study, self.space, result)

    @property
    def finished(self) -> bool:
        """True when nothing more will be proposed and nothing is in flight."""
        return RunRecord.of(self.study).run_ended and not self._open

    @property
    def quiet_wait_s(self) -> float | None:
        """Seconds to wait at most for a busy machine to quiet down (:meth:`machine_quiet`)."""
        return self._quiet_wait_s

    def machine_quiet(self, quiet: bool, waited_s: float) -> None:
        """How the wait :attr:`quiet_wait_s` asked for went: the machine was seen quiet after
        ``waited_s`` (what it decided is measured again), or it stayed busy."""
        self._quiet_wait_s = None
        record.record_wait(self.study, QuietWait(len(self.history().order), quiet, waited_s))

    # --- what the run found -------------------------------------------------------------------

    def history(self) -> History:
        """What the study says of the run now."""
        return self.space.history(self.study.get_trials(deepcopy=False))

    def summary(self) -> TuningSummary:
        """What the run found so far (complete once ``finished``)."""
        history, run = self.history(), RunRecord.of(self.study)
        rules = self._rules(history, run)
        return summarize(
            self._decide(history)[1],
            run,
            self.search,
            finished=self.finished,
            tuning_time_s=rules.budget.elapsed_s,
            noise=(rules.remeasure.noise(), rules.remeasure.noise_measured()),
            cost_model=self.cost_model(),
        )

    def cost_model(self) -> CostModel | None:
        """``model_based``'s cost model fitted to the results so far (None otherwise)."""
        sampler = self.sampler
        return (
            sampler.cost_model(self.history()) if isinstance(sampler, ModelBasedSampler) else None
        )

    def predicted(self, names: Iterable[str]) -> dict[str, float]:
        """``model_based``'s prediction of the metric for each configuration named."""
        sampler = self.sampler
        if not isinstance(sampler, ModelBasedSampler):
            return {}
        return sampler.predicted(self.history(), list(names))

    def optimal_config(self) -> dict[str, Any] | None:
        """The user's config with the best values (None: nothing ran ok)."""
        best = self.summary().best
        if best is None:
            return None
        return self.space.config_of(self.history().entries[best.name])

    def _start(
        self,
        history: History,
        step: Step,
        owed: Experiment | None = None,
        trial: optuna.Trial | None = None,
    ) -> Candidate:
        """Hand out the experiment ``step`` runs, its trial started (:func:`record.start`)."""
        assert step.name is not None and step.entry is not None
        trial = record.start(self.study, self.space, history, step, owed, trial)
        ds_config = self.space.config_of(step.entry)
        stop_above = None if step.repeat_of else self.pruner.step_time_limit(history, ds_config)
        number = owed.number if owed is not None else int(trial.number)
        candidate = Candidate(
            step.name,
            step.entry.overrides,
            ds_config,
            step.phase,
            step.repeat_of,
            stop_above,
            number,
        )
        self._open[step.name] = (trial, candidate)
        self._clock.asked()
        return candidate

    def _end(self, attr: str, stop: StopReason | None, left: str | None = None) -> RunRecord:
        """Record that the search (or the run, and so the search) ended, and why."""
        if attr == record.RUN_END_ATTR and not RunRecord.of(self.study).search_ended:
            record.record_end(self.study, record.SEARCH_END_ATTR, stop)
        record.record_end(self.study, attr, stop, left)
        return RunRecord.of(self.study)

    def _decide(self, history: History) -> tuple[Decision, SearchContext]:
        if isinstance(self.sampler, StudySampler):
            return self.sampler.decision(history)
        seed = self.space.config.autotuning.seed
        context = SearchContext.build(self.space, history, self.search.tuner_type, seed)
        return self.search.decide(context), context

    def _rules(self, history: History, run: RunRecord) -> Stopping:
        tuning = self.space.config.autotuning
        return Stopping.for_driver(history, tuning, self._clock, run, self._busy)
