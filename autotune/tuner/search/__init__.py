"""The searches: what each tuner type measures next, decided from the study alone, walked
over its phases (:mod:`.base`). ``gridsearch`` and ``random``: :class:`~.phased.PhasedSearch`;
``model_based``: :class:`~.model_based.ModelBasedSearch`; an Optuna sampler the user passes:
:class:`~.sampler.SamplerSearch`. :mod:`autotune.tuner.samplers` makes each an Optuna
sampler."""

from autotune.tuner.candidate import Decision, DecisionKind
from autotune.tuner.search.base import Search, SearchContext, Trace
from autotune.tuner.search.model_based import ModelBasedSearch
from autotune.tuner.search.phased import PhasedSearch
from autotune.tuner.search.sampler import SamplerSearch

__all__ = [
    "Decision",
    "DecisionKind",
    "ModelBasedSearch",
    "PhasedSearch",
    "SamplerSearch",
    "Search",
    "SearchContext",
    "Trace",
]
