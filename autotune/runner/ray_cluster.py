"""Connecting to Ray: an existing cluster (an address or ``RAY_ADDRESS``), else an embedded one;
and shutting an embedded one down."""

from __future__ import annotations

import contextlib
import logging
import os
from typing import Any

import ray

from autotune.runner.process import entries_set
from autotune.runner.ray_gang import DriverPaths

_WORKER_NICENESS = "RAY_worker_niceness"  # Ray's own spelling: its raylet reads this name

# The import paths given to the workers of each cluster this process started, by the
# cluster's GCS address (a cluster started later by someone else has none).
_worker_paths: dict[str, tuple[str, ...]] = {}


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
    # PYTHONPATH: the driver's import paths, so that the workers Ray starts ahead of any
    # actor import what the driver imports, and rank actors need no runtime_env of their own.
    # The raylet, and so every worker, inherits this process's environment as ray.init runs.
    paths = DriverPaths.capture().sys_path
    cluster_env = {
        _WORKER_NICENESS: os.environ.get(_WORKER_NICENESS, "0"),
        "PYTHONPATH": os.pathsep.join(paths),
    }
    with entries_set(os.environ, cluster_env):
        ray.init(num_cpus=num_cpus or os.cpu_count(), include_dashboard=False, **common)
    _worker_paths[ray.get_runtime_context().gcs_address] = paths
    return True


def worker_paths() -> tuple[str, ...]:
    """The import paths every worker of the connected cluster has ahead of its own, where
    this process started it (else none are known)."""
    if not ray.is_initialized():
        return ()
    return _worker_paths.get(ray.get_runtime_context().gcs_address, ())


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
    _worker_paths.pop(ray.get_runtime_context().gcs_address, None)
    node = getattr(ray._private.worker, "_global_node", None)
    kill_monitor = getattr(node, "kill_monitor", None)
    if kill_monitor is not None:
        with contextlib.suppress(Exception):
            kill_monitor(check_alive=False)
    ray.shutdown()
