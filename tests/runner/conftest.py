"""The one small local Ray cluster every Ray test shares (started once: ``ray.init`` takes
seconds and most of a GiB)."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest


@pytest.fixture(scope="session")
def ray_cluster() -> Iterator[str]:
    """A 2-CPU embedded Ray for the whole session; yields its address. Runners created while
    it is up connect to it and leave it running."""
    ray = pytest.importorskip("ray")
    context = ray.init(
        num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level=logging.WARNING
    )
    try:
        yield str(context.address_info["address"])
    finally:
        ray.shutdown()
