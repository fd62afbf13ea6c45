"""The tuner: what to run next and when to stop, decided from the run's Optuna study.

The searches are Optuna samplers (:mod:`autotune.tuner.samplers`, public as
:mod:`autotune.samplers`) over a :class:`~autotune.tuner.search_space.SearchSpace`;
:class:`Tuner` drives them with ask and tell, adding re-measurement, the trial cap and the
time budget. It starts no processes: a driver asks for a :class:`Candidate`, runs it, and
tells the :class:`~autotune.experiment.ExperimentResult`.
"""

from autotune.tuner.candidate import Candidate, Phase
from autotune.tuner.memory import MemoryEstimate, estimate_memory
from autotune.tuner.naming import candidate_name, repeat_name
from autotune.tuner.point_order import (
    GridOrder,
    Point,
    PointOrder,
    RandomOrder,
    Subspace,
    make_order,
)
from autotune.tuner.ranking import Ranked, rank, score, within_noise
from autotune.tuner.space import TuningSpace, Variant, VariantPlan, build_space
from autotune.tuner.summary import TuningSummary
from autotune.tuner.tuner import Tuner

__all__ = [
    "Candidate",
    "GridOrder",
    "MemoryEstimate",
    "Phase",
    "Point",
    "PointOrder",
    "RandomOrder",
    "Ranked",
    "Subspace",
    "Tuner",
    "TuningSpace",
    "TuningSummary",
    "Variant",
    "VariantPlan",
    "build_space",
    "candidate_name",
    "estimate_memory",
    "make_order",
    "rank",
    "repeat_name",
    "score",
    "within_noise",
]
