"""The experiment the engine benchmarks time: every one with autotune's default timeout, seed 0
and one core per rank, so that what differs between two of them is what they compare."""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from typing import Any

from autotune.config import AutotuningConfig
from autotune.defaults import DEFAULT_CPUS_PER_RANK
from autotune.experiment import ExperimentSpec


def timed_spec(
    name: str, ds_config: Mapping[str, Any], args: argparse.Namespace, **what: Any
) -> ExperimentSpec:
    """``name`` at ``args``' world size and profile window; ``what`` is the rest (a workload or
    a script, the engine)."""
    return ExperimentSpec(
        name=name,
        ds_config=dict(ds_config),
        world_size=args.world_size,
        start_profile_step=args.start_profile_step,
        end_profile_step=args.end_profile_step,
        timeout_s=AutotuningConfig().timeout_s,
        seed=0,
        cpus_per_rank=DEFAULT_CPUS_PER_RANK,
        **what,
    )
