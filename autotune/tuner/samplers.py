"""Samplers: which point of a finite space to try next. One ask/tell interface, three strategies.

A space is a union of :class:`Subspace` s, each the product of a few value lists under a label
(one per ZeRO variant: its knobs differ). A sampler proposes an open point — one not run, not
pruned and not in flight, as the caller's ``is_open`` says — and learns from what it is told.
It can be told about points it never proposed: that is how a resumed run replays its history.

- :class:`GridSampler`: every point once, in a fixed order.
- :class:`RandomSampler`: every point once, in a seeded random order.
- :class:`OptunaSampler`: Optuna's TPE, seeded, after a few points in the random order; an
  out-of-memory point is infeasible (a constraint, so the model learns where memory ends), a
  failed one is ignored by the model and never proposed again.
"""

from __future__ import annotations

import itertools
import json
import math
import random
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from autotune.config import TunerType

IsOpen = Callable[["Point"], bool]


@dataclass(frozen=True)
class Point:
    """One point: a subspace label and a value for each of its dimensions."""

    label: str
    values: tuple[tuple[str, Any], ...] = ()

    def as_dict(self) -> dict[str, Any]:
        return dict(self.values)


@dataclass(frozen=True)
class Subspace:
    """The product of value lists under one label.

    Example:
        >>> sub = Subspace("z1", (("a", (1, 2)), ("b", (True,))))
        >>> [p.as_dict() for p in sub.points()]
        [{'a': 1, 'b': True}, {'a': 2, 'b': True}]
    """

    label: str
    dims: tuple[tuple[str, tuple[Any, ...]], ...] = ()
    best_so_far: float | None = None  # the variant's best score before this phase, if any
    preferred: Point | None = None  # the point established practice recommends, if any

    def points(self) -> list[Point]:
        keys = [key for key, _ in self.dims]
        products = itertools.product(*(values for _, values in self.dims))
        return [Point(self.label, tuple(zip(keys, combo, strict=True))) for combo in products]


class Sampler(Protocol):
    """What every sampler does.

    Example:
        >>> sampler = GridSampler([Subspace("z0", (("mbs", (8, 4)),))])
        >>> point = sampler.ask(lambda p: True)
        >>> point.as_dict()
        {'mbs': 8}
        >>> sampler.tell(point, score=12.5)
    """

    def ask(self, is_open: IsOpen) -> Point | None:
        """An open point to try next, or None when none is left."""
        ...

    def tell(self, point: Point, score: float | None, infeasible: bool = False) -> None:
        """The outcome of ``point``: a score (higher is better), or None if it failed;
        ``infeasible`` when it ran out of memory."""
        ...


class GridSampler:
    """Every point once, subspace by subspace, each in the order of its value lists."""

    def __init__(self, space: Sequence[Subspace]) -> None:
        self._order = [point for subspace in space for point in subspace.points()]

    def ask(self, is_open: IsOpen) -> Point | None:
        return next((p for p in self._order if is_open(p)), None)

    def tell(self, point: Point, score: float | None, infeasible: bool = False) -> None:
        """The order does not depend on outcomes."""

    def count_open(self, is_open: IsOpen) -> int:
        return sum(1 for p in self._order if is_open(p))


class RandomSampler(GridSampler):
    """Every point once, in an order fixed by the seed (so a resumed run continues it)."""

    def __init__(self, space: Sequence[Subspace], seed: int = 0) -> None:
        super().__init__(space)
        random.Random(seed).shuffle(self._order)


class OptunaSampler:
    """Optuna's TPE over the space, through Optuna's ask/tell.

    The variant label is one categorical parameter and each dimension another, named
    ``label:key`` so that every variant keeps its own distributions. With ``storage`` (an
    Optuna storage URL such as ``sqlite:///results/study.db``) the study outlives the process:
    a resumed run loads it, and outcomes it already holds are not added twice.

    Until ``num_random`` outcomes are known (replayed ones included), points come from the
    seeded random order instead of TPE: Optuna's own start-up draws the variant first, so a
    9-point variant got as many tries as a 72-point one, and TPE then settled on whichever
    variant's defaults did best. A subspace whose best score so far (``best_so_far``, from
    earlier phases) trails the best subspace's by more than ``DEFER_BEHIND`` is left to the
    end of that start-up: by a margin larger than the noise it is worse, so the few random
    points go to the contenders (successive halving's idea, without dropping anything).
    Before them come the subspaces' ``preferred`` points (what practice recommends, such as
    ``overlap_comm`` at ZeRO-2), the subspace with the best score so far first.

    Args:
        space: the subspaces.
        seed: seeds the TPE sampler and the random order.
        storage: an Optuna storage URL, or None for memory.
        study_name: the study's name inside ``storage``.
        max_duplicates: suggestions of closed points tolerated per ask before falling back to
            a random open point (TPE re-proposes good points as the space runs out).
        num_random: outcomes to know before TPE proposes.
    """

    def __init__(
        self,
        space: Sequence[Subspace],
        seed: int = 0,
        storage: str | None = None,
        study_name: str = "autotune",
        max_duplicates: int = 16,
        num_random: int = 8,
    ) -> None:
        import optuna

        optuna.logging.set_verbosity(optuna.logging.WARNING)  # one line per trial otherwise
        self._optuna = optuna
        self._space = {subspace.label: subspace for subspace in space}
        self._max_duplicates = max_duplicates
        self._num_random = num_random
        self._random = RandomSampler(space, seed)
        deferred = _deferred(space)
        preferred = {
            s.preferred: rank
            for rank, s in enumerate(_by_best(space))
            if s.preferred is not None and s.label not in deferred
        }
        # Preferred points first (best subspace first), deferred subspaces last; the sort is
        # stable, so the seeded random order holds otherwise.
        self._random._order.sort(
            key=lambda p: (p not in preferred, preferred.get(p, 0), p.label in deferred)
        )
        self._asked: dict[Point, Any] = {}  # optuna.Trial
        self._worst = 0.0
        with warnings.catch_warnings():
            # multivariate and group are "experimental" yet much better on conditional spaces.
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            sampler = optuna.samplers.TPESampler(
                seed=seed,
                multivariate=True,
                group=True,
                n_startup_trials=0,  # the random order does the start-up (see above)
                # On the synthetic landscape (200 seeds) 64 candidates per proposal did at
                # least as well as the default 24.
                n_ei_candidates=64,
                # Experiments in flight count as the worst result so far, so that points
                # proposed side by side spread out instead of piling onto one promising spot.
                constant_liar=True,
            )
        self._study = optuna.create_study(
            study_name=study_name,
            storage=storage,
            sampler=sampler,
            direction="maximize",
            load_if_exists=True,
        )
        self._told = self._recover()

    def ask(self, is_open: IsOpen) -> Point | None:
        if len(self._told) < self._num_random:
            return self._ask_random(is_open)
        TrialState = self._optuna.trial.TrialState
        # Near the end of a small space TPE mostly re-proposes what it has seen: give up sooner.
        for _ in range(min(self._max_duplicates, self._random.count_open(is_open))):
            trial = self._study.ask()
            point = self._suggest(trial)
            if is_open(point):
                self._asked[point] = trial
                return point
            # Run, pruned or in flight already: drop the suggestion (a failed trial is invisible
            # to TPE, unlike a repeated value that would pull it back here) and ask again.
            self._study.tell(trial, state=TrialState.FAIL)
        return self._ask_random(is_open)

    def _ask_random(self, is_open: IsOpen) -> Point | None:
        """The next open point in the random order, as a trial of the study."""
        point = self._random.ask(is_open)
        if point is None:
            return None
        self._study.enqueue_trial(self._params(point))
        trial = self._study.ask()
        self._suggest(trial)  # takes the enqueued values
        self._asked[point] = trial
        return point

    def tell(self, point: Point, score: float | None, infeasible: bool = False) -> None:
        TrialState = self._optuna.trial.TrialState
        if score is not None:
            self._worst = min(self._worst, score)
        # An infeasible trial still needs a value; TPE ranks it by its constraint alone.
        value = self._worst if infeasible else score
        state = TrialState.FAIL if value is None else TrialState.COMPLETE
        trial = self._asked.pop(point, None)
        if trial is not None:
            trial.set_user_attr("point", _key(point))
            trial.set_constraint("oom", 1.0 if infeasible else 0.0)
            self._study.tell(trial, value, state=state)
        elif _key(point) not in self._told:  # replayed, and not already in the storage
            self._study.add_trial(
                self._optuna.trial.create_trial(
                    state=state,
                    value=value,
                    params=self._params(point),
                    distributions=self._distributions(point),
                    user_attrs={"point": _key(point)},
                    constraints={"oom": 1.0 if infeasible else 0.0} if value is not None else None,
                )
            )
        self._told.add(_key(point))

    def _suggest(self, trial: Any) -> Point:
        label = trial.suggest_categorical("variant", list(self._space))
        values = tuple(
            (key, trial.suggest_categorical(f"{label}:{key}", list(choices)))
            for key, choices in self._space[label].dims
        )
        return Point(label, values)

    def _params(self, point: Point) -> dict[str, Any]:
        return {"variant": point.label, **{f"{point.label}:{k}": v for k, v in point.values}}

    def _distributions(self, point: Point) -> dict[str, Any]:
        categorical = self._optuna.distributions.CategoricalDistribution
        dims = dict(self._space[point.label].dims)
        return {
            "variant": categorical(list(self._space)),
            **{f"{point.label}:{k}": categorical(list(dims[k])) for k, _ in point.values},
        }

    def _recover(self) -> set[str]:
        """Points a stored study already has outcomes for; trials left running are failed."""
        TrialState = self._optuna.trial.TrialState
        told = set()
        for trial in self._study.get_trials(deepcopy=False):
            if trial.state is TrialState.RUNNING:  # the previous run was interrupted
                self._study.tell(trial.number, state=TrialState.FAIL)
            elif "point" in trial.user_attrs:
                told.add(trial.user_attrs["point"])
                if trial.value is not None:
                    self._worst = min(self._worst, trial.value)
        return told


# How far behind the best a subspace must be to be deferred: above this machine's run-to-run
# noise between medians, below the gaps the memory budget makes between stages.
DEFER_BEHIND = 0.2


def _deferred(space: Sequence[Subspace]) -> set[str]:
    """Labels of subspaces whose best so far trails the best one's by more than DEFER_BEHIND."""
    known = [s.best_so_far for s in space if s.best_so_far is not None]
    if not known or max(known) <= 0:
        return set()
    cut = (1.0 - DEFER_BEHIND) * max(known)
    return {s.label for s in space if s.best_so_far is not None and s.best_so_far < cut}


def _by_best(space: Sequence[Subspace]) -> list[Subspace]:
    """The subspaces, best score so far first (unscored last, in their order)."""
    return sorted(space, key=lambda s: -s.best_so_far if s.best_so_far is not None else math.inf)


def make_sampler(
    kind: TunerType | str,
    space: Sequence[Subspace],
    seed: int = 0,
    storage: str | None = None,
    study_name: str = "autotune",
) -> Sampler:
    """The sampler for ``autotuning.tuner_type``.

    Example:
        >>> space = [Subspace("z0", (("mbs", (1, 2, 4)),))]
        >>> type(make_sampler("random", space, seed=3)).__name__
        'RandomSampler'
    """
    kind = TunerType(kind)
    if kind is TunerType.gridsearch:
        return GridSampler(space)
    if kind is TunerType.random:
        return RandomSampler(space, seed)
    return OptunaSampler(space, seed, storage, study_name)


def _key(point: Point) -> str:
    return json.dumps([point.label, [list(item) for item in point.values]])
