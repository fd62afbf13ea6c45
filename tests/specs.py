"""Experiment specs for tests: every field a job decides (ExperimentSpec has no defaults for
them) filled with one small test job's values, which a test overrides where it matters."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from autotune.experiment import ExperimentSpec

TEST_JOB: dict[str, Any] = {
    "workload": "gpt",
    "workload_args": {},
    "world_size": 2,
    "start_profile_step": 1,
    "end_profile_step": 2,
    "timeout_s": 120.0,
    "seed": 0,
    "cpus_per_rank": 1,
}


def job_spec(
    name: str, ds_config: Mapping[str, Any] | None = None, **fields: Any
) -> ExperimentSpec:
    """An experiment ``name`` running ``ds_config`` in the test job, ``fields`` changed."""
    return ExperimentSpec(name=name, ds_config=dict(ds_config or {}), **{**TEST_JOB, **fields})
