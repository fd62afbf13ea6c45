"""Connecting to Ray: an existing cluster (an address or ``RAY_ADDRESS``), else an embedded one."""

from __future__ import annotations

import logging
import os
from typing import Any

import ray

from autotune.runner.process import entries_set

_WORKER_NICENESS = "RAY_worker_niceness"  # Ray's own spelling: its raylet reads this name


def connect_ray(address: str | None, num_cpus: int | None, quiet: bool) -> bool:
    """Connect to Ray, or start a local cluster (``num_cpus`` CPUs, default all); True if this
    call started it (and so its caller must shut it down)."""
    if ray.is_initialized():
        return False
    address = address or os.environ.get("RAY_ADDRESS")
    # Quiet: Ray's own start-up notices (auth tokens, dashboard) are not the user's business.
    level = logging.ERROR if quiet else logging.WARNING
    common: dict[str, Any] = {"log_to_driver": not quiet, "logging_level": level}
    if address:
        ray.init(address=address, **common)
        return False
    # Ray starts workers at niceness 15, so the ranks of an experiment yielded the CPU to any
    # other process on the node (a notebook, a build) and measured its load, not the config.
    # Ranks run as training would; an explicit RAY_worker_niceness still wins.
    niceness = {_WORKER_NICENESS: os.environ.get(_WORKER_NICENESS, "0")}
    with entries_set(os.environ, niceness):
        ray.init(num_cpus=num_cpus or os.cpu_count(), include_dashboard=False, **common)
    return True
