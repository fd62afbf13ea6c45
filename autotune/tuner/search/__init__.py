"""The searches: what each tuner type measures next while its search runs, each an Optuna
sampler of the run's study (:mod:`.base`). ``gridsearch`` and ``random``:
:class:`~.phased.PhasedSearch`; ``model_based``: :class:`~.model_based.ModelBasedSearch`; an
Optuna sampler the user passes: :class:`~.sampler.SamplerSearch`."""

from autotune.tuner.search.base import Search, SearchContext
from autotune.tuner.search.model_based import ModelBasedSearch
from autotune.tuner.search.phased import PhasedSearch
from autotune.tuner.search.sampler import SamplerSearch

__all__ = ["ModelBasedSearch", "PhasedSearch", "SamplerSearch", "Search", "SearchContext"]
