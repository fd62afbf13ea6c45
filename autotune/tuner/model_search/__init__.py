"""``model_based``'s search, along its jobs: the configurations and what the cost model counts
of each (:mod:`.index`), the chance each fits in memory (:mod:`.fit_chance`), the residual
process that corrects the model near what was measured (:mod:`.residuals`), and the choice
of what to measure next and when nothing left is worth it (:mod:`.search`)."""

from autotune.tuner.model_search.index import Key, Knobs, SpaceIndex, accumulation_steps, step_shape
from autotune.tuner.model_search.scored import (
    MIN_FIT_PROBABILITY,
    Scored,
    metric_log,
    worth_measuring,
)
from autotune.tuner.model_search.search import ModelSearch

__all__ = [
    "MIN_FIT_PROBABILITY",
    "Key",
    "Knobs",
    "ModelSearch",
    "Scored",
    "SpaceIndex",
    "accumulation_steps",
    "metric_log",
    "step_shape",
    "worth_measuring",
]
