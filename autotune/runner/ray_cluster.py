"""Connecting to Ray: an existing cluster (an address or ``RAY_ADDRESS``), else an embedded one;
and shutting an embedded one down."""

from __future__ import annotations

import contextlib
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


def shutdown_ray() -> None:
    """``ray.shutdown()`` of a cluster this process started, less the second it waits for
    Ray's autoscaler monitor.

    Ray stops its processes one by one, the GCS before the monitor; the monitor answers
    SIGTERM by reporting to the GCS, which is gone by then, so Ray waits a second and kills
    it. Measured: 1.0 of the 1.4 s ``ray.shutdown()`` took. An embedded cluster has nothing
    for the monitor to scale: it is killed first. (Ray's node object is private: if it
    changes, this saving is lost and nothing else.)
    """
    if not ray.is_initialized():
        return
    node = getattr(ray._private.worker, "_global_node", None)
    kill_monitor = getattr(node, "kill_monitor", None)
    if kill_monitor is not None:
        with contextlib.suppress(Exception):
            kill_monitor(check_alive=False)
    ray.shutdown()
