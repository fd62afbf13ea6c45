"""Running experiments: on local processes (tests, simple use) or a warm Ray actor pool.

Runners decide nothing about what to run; they turn an ExperimentSpec into an
ExperimentResult and never raise for a failed experiment.
"""

from typing import Any

from autotune.runner.local import InProcessRunner, LocalRunner, run_local
from autotune.runner.outcome import RankOutcome, combine_outcomes, experiment_verdict
from autotune.runner.process import free_port
from autotune.runner.rank import run_rank


def __getattr__(name: str) -> Any:
    # Ray is heavy and imported in the ray_* modules only: load it when RayRunner is asked for.
    if name == "RayRunner":
        from autotune.runner.ray_runner import RayRunner

        return RayRunner
    raise AttributeError(f"module 'autotune.runner' has no attribute {name!r}")


__all__ = [
    "InProcessRunner",
    "LocalRunner",
    "RankOutcome",
    "RayRunner",
    "combine_outcomes",
    "experiment_verdict",
    "free_port",
    "run_local",
    "run_rank",
]
