"""The one small local Ray cluster every Ray test shares (started once: ``ray.init`` takes
seconds and most of a GiB), and Ctrl-C as a user's shell delivers it, in every test."""

from __future__ import annotations

import os
import signal
import sys
import threading
import warnings
from collections.abc import Iterator

import pytest


@pytest.fixture(autouse=True)
def import_path_and_folder_restored() -> Iterator[None]:
    """Each test leaves ``sys.path`` and the working directory as it found them: building a
    user workload adds its folder to the import path, as a job's own process should, and a
    later test's Ray cluster takes the import path for its workers' PYTHONPATH (a test folder
    holding a ``torch/`` then shadowed torch in every worker)."""
    path, folder = list(sys.path), os.getcwd()
    yield
    sys.path[:] = path
    os.chdir(folder)


@pytest.fixture(autouse=True)
def ctrl_c_as_a_shell_delivers_it(request: pytest.FixtureRequest) -> Iterator[None]:
    """Each test starts with Ctrl-C raising KeyboardInterrupt, and one that leaves it changed
    is named and undone: the process's handling of SIGINT is shared by every later test in
    it, and by every process they start (one started with SIGINT ignored never sees Ctrl-C).
    A library run in this process may change it (Lightning's Trainer ignores SIGINT once
    interrupted, for its shutdown)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    left = signal.getsignal(signal.SIGINT)
    if left is not signal.default_int_handler:
        signal.signal(signal.SIGINT, signal.default_int_handler)
        warnings.warn(f"{request.node.nodeid} left SIGINT handled by {left!r}", stacklevel=1)


@pytest.fixture(scope="session")
def ray_cluster() -> Iterator[str]:
    """A 2-CPU embedded Ray for the whole session; yields its address. Runners created while
    it is up connect to it and leave it running."""
    ray = pytest.importorskip("ray")
    from autotune.runner import ray_runner
    from autotune.runner.ray_cluster import connect_ray

    # Started as a runner starts its own, so the tests see the ranks a user's run gets.
    connect_ray(None, num_cpus=2, quiet=True)
    # Each test's runs start on the actors an earlier test's runs of the same kind left warm,
    # as a notebook's second run does with keep_warm: torch and the scripts' libraries are
    # imported once per worker, not once per run (this process only: subprocesses' runners
    # on other clusters must free their CPUs as they close).
    keep_warm = pytest.MonkeyPatch()
    keep_warm.setattr(ray_runner, "KEEP_WARM_DEFAULT", True)
    try:
        yield str(ray.get_runtime_context().gcs_address)
    finally:
        keep_warm.undo()
        ray.shutdown()
