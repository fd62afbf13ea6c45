"""A configuration not yet measured as ``model_based`` scores it (:class:`Scored`), whether any
could still beat the best (:func:`worth_measuring`), and the fits a sampler keeps
(:class:`FitCache`)."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import NamedTuple

from autotune.config import Metric
from autotune.tuner.cost_model import CostModel
from autotune.tuner.model_search.index import Key
from autotune.tuner.ranking import TOLERANCE

# The upper end of a prediction the stopping rule looks at: one-sided 90%.
OPTIMISM_Z = 1.28
# Configurations less likely than this to fit are not worth waiting for.
MIN_FIT_PROBABILITY = 0.25


class Scored(NamedTuple):
    """A configuration not yet measured, as the model sees it now (a named tuple: a decision
    makes one for each of thousands of configurations, and a tuple is made in C).

    Attributes:
        name: its name.
        key: its variant, micro-batch and knobs.
        mean: the predicted metric's log, oriented so that higher is better.
        sd: the prediction's standard deviation (constants, misfit).
        fit_probability: the chance that it fits in memory.
        gain: the predicted log of how much better than the best measured it is (its
            prediction less the model's for the best measured, both corrected by what ran).
        gain_sd: that difference's standard deviation: small between near neighbours,
            whose errors go together.
    """

    name: str
    key: Key
    mean: float
    sd: float
    fit_probability: float
    gain: float = 0.0
    gain_sd: float = 0.0

    @property
    def optimistic_gain(self) -> float:
        """The upper end of how much better than the best measured it could be (the log of
        the ratio, one-sided 90%)."""
        return self.gain + OPTIMISM_Z * self.gain_sd


def metric_log(metric: Metric, value: float) -> float:
    """The log of a metric's value, oriented so that higher is better."""
    return -math.log(value) if metric.lower_is_better else math.log(value)


class FitCache:
    """The cost model fitted to each set of measurements seen (a sampler's, across its
    decisions): the fit is the slow part of a decision, and the same results fit alike."""

    def __init__(self) -> None:
        self._fits: dict[tuple[str, ...], CostModel] = {}

    def get(self, key: tuple[str, ...], make: Callable[[], CostModel]) -> CostModel:
        if key not in self._fits:
            if len(self._fits) > 64:  # only the latest matter: results are only added
                self._fits.clear()
            self._fits[key] = make()
        return self._fits[key]


def worth_measuring(candidates: Sequence[Scored]) -> bool:
    """Whether any candidate likely to fit could still beat the best measured by more than
    the tolerance."""
    line = math.log(1.0 + TOLERANCE)
    return any(
        s.optimistic_gain > line for s in candidates if s.fit_probability >= MIN_FIT_PROBABILITY
    )
