"""The one small local Ray cluster every Ray test shares (started once: ``ray.init`` takes
seconds and most of a GiB)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest


@pytest.fixture(scope="session")
def ray_cluster() -> Iterator[str]:
    """A 2-CPU embedded Ray for the whole session; yields its address. Runners created while
    it is up connect to it and leave it running."""
    ray = pytest.importorskip("ray")
    from autotune.runner.ray_cluster import connect_ray

    # Started as a runner starts its own, so the tests see the ranks a user's run gets.
    connect_ray(None, num_cpus=2, quiet=True)
    try:
        yield str(ray.get_runtime_context().gcs_address)
    finally:
        ray.shutdown()
