"""autotune's tuners as Optuna samplers, for your own Optuna study (or Ray Tune's
``OptunaSearch``): each decides from ``study.get_trials()`` alone.

Example::

    import optuna
    from autotune.samplers import ModelBasedSampler, SearchSpace

    space = SearchSpace("ds_config.json", world_size=8, device_memory="80GiB",
                        workload="hf:llama", workload_args={"hidden_size": 2048})
    study = optuna.create_study(direction=space.direction, sampler=ModelBasedSampler(space))

    def objective(trial):
        params = space.suggest(trial)
        ds_config = space.ds_config(params)
        ...  # train a few steps with it; out of memory:
        #     trial.set_user_attr("status", "oom"); raise optuna.TrialPruned()
        return samples_per_s

    study.optimize(objective, n_trials=100)  # ends early: the sampler stops the study

See the docs' page "Use autotune's samplers in your own Optuna study".
"""

from autotune.tuner.pruner import LoserPruner
from autotune.tuner.samplers import (
    GridSampler,
    ModelBasedSampler,
    RandomSampler,
    SearchOver,
    StudySampler,
)
from autotune.tuner.search_space import NotRunnable, SearchSpace

__all__ = [
    "GridSampler",
    "LoserPruner",
    "ModelBasedSampler",
    "NotRunnable",
    "RandomSampler",
    "SearchOver",
    "SearchSpace",
    "StudySampler",
]
