"""Losers stopped after their first timed steps: an Optuna pruner, :class:`LoserPruner`.

Once something ran ok, a configuration whose steps are slower than the tolerance allows, with
:data:`LOSER_MARGIN` to spare, cannot come within the tolerance of the best, and the rest of
its window is time lost. In a plain Optuna objective, report the metric measured so far at
each step (``trial.report(value, step)``) and stop where ``trial.should_prune()`` says; autotune's
ranks cannot ask the study at every step, so they stop at the step time the same rule sets
(:meth:`LoserPruner.step_time_limit`), and the trial is told ``PRUNED`` with the steps it ran.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import optuna

from autotune.tuner.ranking import TOLERANCE

if TYPE_CHECKING:
    from optuna.study import Study
    from optuna.trial import FrozenTrial

    from autotune.tuner.history import History
    from autotune.tuner.search_space import SearchSpace

# How much slower than the tolerance allows a search experiment's first timed steps must be
# before it is stopped as a loser: a single step varies by a few percent, and so does the
# best's own value.
LOSER_MARGIN = 0.15


class LoserPruner(optuna.pruners.BasePruner):
    """Prunes a trial whose metric so far cannot come within the tolerance of the best (see
    the module docstring).

    Args:
        space: what is searched (the metric, the model's FLOPs).
        margin: how far beyond the tolerance a trial's steps must be.

    Example:
        >>> import optuna
        >>> from autotune.samplers import LoserPruner, SearchSpace
        >>> space = SearchSpace({"zero_optimization": {"stage": 1}}, world_size=2)
        >>> pruner = LoserPruner(space)
        >>> round(pruner.limit(100.0), 2)  # throughput below this is a loser's
        85.22
    """

    def __init__(self, space: SearchSpace, margin: float = LOSER_MARGIN) -> None:
        self.space = space
        self.margin = margin

    @property
    def _metric(self) -> Any:
        return self.space.config.autotuning.metric

    def limit(self, best: float) -> float:
        """The metric's value beyond which a trial is a loser, where the best is ``best``."""
        if self._metric.lower_is_better:
            return best * (1.0 + TOLERANCE) * (1.0 + self.margin)
        return best * (1.0 - TOLERANCE) / (1.0 + self.margin)

    def best(self, history: History) -> float | None:
        """The best configuration's value so far (None: none, or one measured only on a busy
        machine, whose value says too little)."""
        ranking = history.ranking(self._metric)
        if not ranking or ranking[0].disturbed or ranking[0].value <= 0:
            return None
        return ranking[0].value

    def prune(self, study: Study, trial: FrozenTrial) -> bool:
        step = trial.last_step
        best = self.best(self.space.history(study.get_trials(deepcopy=False)))
        if step is None or best is None:
            return False
        value = trial.intermediate_values[step]
        limit = self.limit(best)
        return value > limit if self._metric.lower_is_better else value < limit

    def step_time_limit(self, history: History, ds_config: Mapping[str, Any]) -> float | None:
        """The step time above which a configuration run at ``ds_config`` is a loser (None:
        no best yet, or the metric's value per step is unknown): what autotune's ranks stop
        at."""
        best = self.best(history)
        if best is None:
            return None
        micro = int(ds_config.get("train_micro_batch_size_per_gpu") or 0)
        steps = int(ds_config.get("gradient_accumulation_steps") or 1)
        info = self.space.model(history)
        flops_per_step = info.flops_per_sample * micro * steps if info is not None else 0.0
        batch = int(ds_config.get("train_batch_size") or 0)
        per_step = {"throughput": batch, "flops": flops_per_step}.get(self._metric.value, 1.0)
        if per_step <= 0:
            return None
        return float(self._metric.step_time_s(self.limit(best), batch, flops_per_step))
