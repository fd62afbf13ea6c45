"""Running experiments: on local processes (tests, simple use) or a warm Ray actor pool.

Runners decide nothing about what to run; they turn an ExperimentSpec into an
ExperimentResult and never raise for a failed experiment.
"""

from autotune.runner.local import LocalRunner, free_port, run_local
from autotune.runner.outcome import combine_outcomes
from autotune.runner.rank import RankOutcome, run_rank

__all__ = ["LocalRunner", "RankOutcome", "combine_outcomes", "free_port", "run_local", "run_rank"]
