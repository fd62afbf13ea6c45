"""A sampled search phase (the micro-batch sizes, then the knobs): the phase's point order over
its points, each point known by the name of the configuration it stands for."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from autotune.config import AutotuningConfig
from autotune.experiment import ExperimentResult, Status
from autotune.tuner.candidate import PHASES, Phase
from autotune.tuner.history import History
from autotune.tuner.point_order import Point, Subspace, make_order
from autotune.tuner.ranking import score


class PhaseSearch:
    """The point order of ``phase`` over ``subspaces``, told the results ``history`` already has
    (a resumed run).

    Args:
        phase: the phase it searches (seeds the order).
        subspaces: what it searches, per variant.
        names: each point's configuration name.
        tuning: the ``autotuning`` section (tuner type, seed, metric).
        history: what the tuner has seen.
    """

    def __init__(
        self,
        phase: Phase,
        subspaces: Sequence[Subspace],
        names: Mapping[Point, str],
        tuning: AutotuningConfig,
        history: History,
    ) -> None:
        self._metric = tuning.metric
        self._order = make_order(
            tuning.tuner_type,
            subspaces,
            seed=tuning.seed + PHASES.index(phase),
        )
        self._names = dict(names)
        self.points = {name: point for point, name in names.items()}  # name → point
        for name in history.order:
            self.tell(history.results[name])

    def __contains__(self, name: object) -> bool:
        return name in self.points

    def ask(self, is_open: Callable[[str], bool]) -> str | None:
        """The name of the next point the order picks among the open ones (None: none)."""
        point = self._order.ask(lambda p: is_open(self._names[p]))
        return self._names[point] if point is not None else None

    def tell(self, result: ExperimentResult) -> None:
        """Tell the order ``result``, if it is one of its points."""
        point = self.points.get(result.name)
        if point is None:
            return
        value = score(result.metrics, self._metric) if result.metrics and result.ok else None
        self._order.tell(point, value, infeasible=result.status is Status.oom)

    def drop(self, name: str) -> None:
        """``name`` will never run (a rule rejects it, or the time left is too short)."""
        point = self.points.get(name)
        if point is not None:
            self._order.tell(point, None)
