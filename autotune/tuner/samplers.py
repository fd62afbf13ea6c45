"""autotune's searches as Optuna samplers: each decides from ``study.get_trials()`` alone.

At every trial a sampler reads the study (:meth:`SearchSpace.history
<autotune.tuner.search_space.SearchSpace.history>`), walks its search over it
(:mod:`autotune.tuner.search`) and hands Optuna the configuration chosen, as the relative
parameters :meth:`SearchSpace.suggest <autotune.tuner.search_space.SearchSpace.suggest>`
takes. Nothing outlives a decision but caches of what the same trials gave (the cost model's
fits, its index of the space), so any process that shares the study's storage decides alike,
``study.optimize(n_jobs=...)`` included, and Ray Tune's ``OptunaSearch(sampler=...)`` takes
it as it is.

- A configuration another trial runs (``RUNNING``) is never proposed; within one process a
  configuration handed to a trial counts as running from that moment.
- Where the next configuration needs a result in flight (the end of a phase, the next size
  of a micro-batch search), the sampler waits for it, polling the study.
- When the search is over, the sampler stops the study's ``optimize`` (``study.stop()``) and
  writes why in the study's user attribute ``search_end``; a trial asked after that is
  pruned at its first suggestion (:class:`SearchOver`).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import optuna
from optuna.distributions import BaseDistribution

from autotune.config import TunerType
from autotune.tuner.hardware import CATALOG, Hardware
from autotune.tuner.history import Experiment, History
from autotune.tuner.record import SEARCH_END_ATTR, record_end
from autotune.tuner.search import (
    Decision,
    DecisionKind,
    ModelBasedSearch,
    PhasedSearch,
    Search,
    SearchContext,
)
from autotune.tuner.trials import experiments_of

if TYPE_CHECKING:
    from optuna.study import Study
    from optuna.trial import FrozenTrial, TrialState

    from autotune.tuner.candidate import Phase
    from autotune.tuner.history import Entry
    from autotune.tuner.search_space import SearchSpace
    from autotune.tuner.warm_start import WarmStart


class SearchOver(optuna.TrialPruned):
    """The sampler's search is over: a trial asked after its end is pruned unrun."""


class StudySampler(optuna.samplers.BaseSampler):
    """One of autotune's searches over ``space``, as an Optuna sampler (see the module
    docstring); :class:`ModelBasedSampler`, :class:`GridSampler` and :class:`RandomSampler`
    are the ones to make.

    Args:
        space: what is searched.
        search: the search.
        seed: seeds the search's orders (default: the config's ``autotuning.seed``).
        poll_s: how often a waiting sampler reads the study again.
        max_wait_s: how long it waits for a result at most (None: as long as it takes);
            past it, it raises ``TimeoutError``.
    """

    def __init__(
        self,
        space: SearchSpace,
        search: Search,
        seed: int | None = None,
        poll_s: float = 0.2,
        max_wait_s: float | None = None,
    ) -> None:
        self.space = space
        self.search = search
        self.seed = space.config.autotuning.seed if seed is None else seed
        self._poll_s = poll_s
        self._max_wait_s = max_wait_s
        self._lock = threading.RLock()
        # Trial number → the configuration handed to it, and the phase that proposed it.
        self._handed: dict[int, tuple[Entry, Phase]] = {}
        self._proposals: dict[int, dict[str, Any]] = {}  # trial number → its parameters
        self._last: tuple[tuple[Any, ...], Decision, SearchContext] | None = None
        self._fallback = optuna.samplers.RandomSampler(self.seed)

    def __getstate__(self) -> dict[str, Any]:
        """What pickling keeps (Ray Tune saves its searcher): all but the lock and the last
        decision, which a copy makes again."""
        state = dict(self.__dict__)
        del state["_lock"]
        state["_last"] = None
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.RLock()

    # --- deciding -----------------------------------------------------------------------------

    def decide(self, history: History) -> Decision:
        """What the search wants next, given what ``history`` holds (the same history
        decides alike: the last decision is kept)."""
        return self.decision(history)[0]

    def decision(self, history: History) -> tuple[Decision, SearchContext]:
        """:meth:`decide`, with the context the walk read (its trace)."""
        key = (
            tuple((e.name, e.number, e.result is None) for e in history),
            tuple(history.order),
        )
        with self._lock:
            if self._last is None or self._last[0] != key:
                context = SearchContext.build(
                    self.space, history, self.search.tuner_type, self.seed
                )
                self._last = (key, self.search.decide(context), context)
            return self._last[1], self._last[2]

    def history(self, study: Study, trials: Sequence[FrozenTrial] | None = None) -> History:
        """What the study says of the run, each configuration handed to a trial of this
        process counted as running (its parameters may not be in the study yet)."""
        trials = study.get_trials(deepcopy=False) if trials is None else trials
        handed = dict(self._handed)
        experiments, told = experiments_of(
            [t for t in trials if t.number not in handed], self.space
        )
        running = {t.number for t in trials if t.number in handed and not t.state.is_finished()}
        for number in running:
            entry, phase = handed[number]
            name = self.space.name_of(entry)
            experiments.append(Experiment(name, number, entry, phase=phase.value))
        return History(experiments, told)

    # --- Optuna's side ------------------------------------------------------------------------

    def infer_relative_search_space(
        self, study: Study, trial: FrozenTrial
    ) -> dict[str, BaseDistribution]:
        entry = self._propose(study, trial)
        params, dists = self.space.params(entry, self.history(study))
        self._proposals[trial.number] = params
        return dists

    def sample_relative(
        self, study: Study, trial: FrozenTrial, search_space: dict[str, BaseDistribution]
    ) -> dict[str, Any]:
        params = self._proposals.pop(trial.number, {})
        return {name: value for name, value in params.items() if name in search_space}

    def sample_independent(
        self,
        study: Study,
        trial: FrozenTrial,
        param_name: str,
        param_distribution: BaseDistribution,
    ) -> Any:
        """A parameter outside the configuration proposed (the objective's own): the
        config's value where it is one of the choices, else drawn at random."""
        own = self.space.blind.base.get(param_name)
        if own is not None and _holds(param_distribution, own):
            return own
        return self._fallback.sample_independent(study, trial, param_name, param_distribution)

    def after_trial(
        self,
        study: Study,
        trial: FrozenTrial,
        state: TrialState,
        values: Sequence[float] | None,
    ) -> None:
        """Once a trial is told: where the search is over, stop the study's ``optimize``."""
        with self._lock:
            self._handed.pop(trial.number, None)
            told = _told(trial, state, values)
            trials = [
                told if t.number == trial.number else t for t in study.get_trials(deepcopy=False)
            ]
            decision = self.decide(self.history(study, trials))
        if decision.kind is DecisionKind.end:
            _stop(study, decision)

    def reseed_rng(self) -> None:
        """Nothing to reseed: a search's orders follow its seed, in every thread alike."""

    # --- proposing ------------------------------------------------------------------------------

    def _propose(self, study: Study, trial: FrozenTrial) -> Entry:
        """The configuration for ``trial``: the search's proposal once it has one (waiting
        for results in flight meanwhile), handed to the trial.

        Raises:
            SearchOver: the search is over.
            TimeoutError: no result came within ``max_wait_s``.
        """
        started = time.monotonic()
        while True:
            with self._lock:
                trials = [t for t in study.get_trials(deepcopy=False) if t.number != trial.number]
                decision = self.decide(self.history(study, trials))
                if decision.kind is DecisionKind.propose:
                    assert decision.entry is not None
                    self._handed[trial.number] = (decision.entry, decision.phase)
                    return decision.entry
            if decision.kind is DecisionKind.end:
                _stop(study, decision)
                why = decision.stop.kind.value if decision.stop is not None else "exhausted"
                raise SearchOver(f"the search is over ({why})")
            if self._max_wait_s is not None and time.monotonic() - started > self._max_wait_s:
                raise TimeoutError(
                    f"no result came in {self._max_wait_s:g} s, and the search needs one"
                )
            time.sleep(self._poll_s)


class ModelBasedSampler(StudySampler):
    """``model_based``, autotune's default: a cost model of the ZeRO step, fitted to the
    study's results, picks the configuration most likely to beat the best; the search ends
    when nothing left could beat it by more than the tolerance (2%).

    Args:
        space: what is searched.
        seed: seeds the search (default: the config's ``autotuning.seed``).
        hardware: what the ranks run on, the cost model's starting point: a
            :class:`~autotune.tuner.hardware.Hardware` or a catalog name (``"h100-80gb"``;
            default: CPU ranks).
        ranks_per_node: ranks that share a node's links (default: all of them).
        warm_start: what earlier runs on the same hardware taught.
        **options: as :class:`StudySampler`'s (``poll_s``, ``max_wait_s``).

    Example:
        >>> import optuna
        >>> from autotune.samplers import ModelBasedSampler, SearchSpace
        >>> space = SearchSpace({"zero_optimization": {"stage": [1, 2]}}, world_size=2)
        >>> study = optuna.create_study(direction=space.direction,
        ...                             sampler=ModelBasedSampler(space, seed=0))
        >>> space.suggest(study.ask())  # no model's size given: the largest size first
        {'zero_stage': 1, 'micro_batch_size': 1024}
    """

    def __init__(
        self,
        space: SearchSpace,
        seed: int | None = None,
        hardware: Hardware | str | None = None,
        ranks_per_node: int | None = None,
        warm_start: WarmStart | None = None,
        **options: Any,
    ) -> None:
        if isinstance(hardware, str):
            hardware = CATALOG[hardware]
        search = ModelBasedSearch(hardware, ranks_per_node, warm_start)
        super().__init__(space, search, seed, **options)

    def cost_model(self, history: History) -> Any:
        """The cost model fitted to ``history``'s results (None before the model's size is
        known)."""
        search = self.search
        assert isinstance(search, ModelBasedSearch)
        return search.model_search(self.decision(history)[1]).fitted()

    def predicted(self, history: History, names: Sequence[str]) -> dict[str, float]:
        """The model's prediction of the metric for each configuration named."""
        search = self.search
        assert isinstance(search, ModelBasedSearch)
        return search.model_search(self.decision(history)[1]).predicted(names)


class GridSampler(StudySampler):
    """``gridsearch``: DeepSpeed's autotuner's flow: each variant's largest micro-batch, then
    sizes below it, then the knobs at the best, each phase in a fixed order.

    Args:
        space: what is searched.
        seed: as :class:`StudySampler`'s.
        **options: as :class:`StudySampler`'s.
    """

    def __init__(self, space: SearchSpace, seed: int | None = None, **options: Any) -> None:
        super().__init__(space, PhasedSearch(TunerType.gridsearch), seed, **options)


class RandomSampler(StudySampler):
    """``random``: :class:`GridSampler`'s flow, each phase in a seeded random order.

    Args:
        space: what is searched.
        seed: seeds the orders (default: the config's ``autotuning.seed``).
        **options: as :class:`StudySampler`'s.
    """

    def __init__(self, space: SearchSpace, seed: int | None = None, **options: Any) -> None:
        super().__init__(space, PhasedSearch(TunerType.random), seed, **options)


def make_sampler(
    space: SearchSpace,
    tuner_type: TunerType | str,
    seed: int | None = None,
    hardware: Hardware | str | None = None,
    ranks_per_node: int | None = None,
    warm_start: WarmStart | None = None,
) -> StudySampler:
    """The sampler of ``autotuning.tuner_type`` (``hardware``, ``ranks_per_node`` and
    ``warm_start`` are ``model_based``'s)."""
    kind = TunerType(tuner_type)
    if kind is TunerType.model_based:
        return ModelBasedSampler(space, seed, hardware, ranks_per_node, warm_start)
    return (GridSampler if kind is TunerType.gridsearch else RandomSampler)(space, seed)


def _holds(distribution: BaseDistribution, value: Any) -> bool:
    """Whether ``value`` is one of ``distribution``'s."""
    from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

    if isinstance(distribution, CategoricalDistribution):
        return value in distribution.choices
    if isinstance(distribution, IntDistribution | FloatDistribution):
        number = isinstance(value, int | float) and not isinstance(value, bool)
        return number and distribution.low <= value <= distribution.high
    return False


def _told(trial: FrozenTrial, state: TrialState, values: Sequence[float] | None) -> FrozenTrial:
    """``trial`` as it stands once told (Optuna calls ``after_trial`` before it writes the
    state)."""
    import copy
    import datetime

    told = copy.copy(trial)
    told.state = state
    told.values = list(values) if values is not None else None
    told.datetime_complete = datetime.datetime.now()
    return told


def _stop(study: Study, decision: Decision) -> None:
    """End ``study.optimize`` for ``decision``'s reason, and say why in the study; outside
    ``optimize`` (autotune's own loop, which re-measures first) nothing is written."""
    try:
        study.stop()
    except RuntimeError:  # not in study.optimize: its caller decides when the run ends
        return
    if SEARCH_END_ATTR not in study.user_attrs:
        record_end(study, SEARCH_END_ATTR, decision.stop)
