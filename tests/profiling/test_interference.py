"""Other processes competing for the ranks' cores are seen in the window's CPU accounting;
the rank's own children are its own work."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from autotune.profiling.interference import (
    DISTURBED_OVERSUBSCRIPTION,
    WindowCpu,
    is_disturbed,
    oversubscription,
    sample_cpu,
)

pytestmark = pytest.mark.skipif(sample_cpu() is None, reason="no /proc/stat")
BURN = "import time\nend = time.time() + {seconds}\nwhile time.time() < end: pass"


def window_over(seconds: float) -> WindowCpu:
    """This process's view of its node over ``seconds``, busy itself on one core."""
    before = sample_cpu()
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        pass
    window = WindowCpu.between(before, sample_cpu())
    assert window is not None
    return window


def oversubscribed(window: WindowCpu) -> float:
    # One rank asking for all the node's cores: anything others use oversubscribes it.
    busy = oversubscription([window.to_dict()], threads_per_rank=window.node_cores)
    assert busy is not None
    return busy


def test_a_neighbour_burning_a_core_oversubscribes_the_ranks() -> None:
    quiet = oversubscribed(window_over(1.0))
    # Detached (its parent exits at once): not this process's descendant, a neighbour.
    subprocess.run(["sh", "-c", f"{sys.executable} -c '{BURN.format(seconds=1.5)}' &"], check=True)
    time.sleep(0.1)
    busy = oversubscribed(window_over(1.0))
    time.sleep(0.5)  # the neighbour's end, before anything else measures
    assert is_disturbed(busy) and busy > quiet + DISTURBED_OVERSUBSCRIPTION, (quiet, busy)


def test_the_ranks_own_children_are_their_work_not_a_neighbours() -> None:
    child = subprocess.Popen([sys.executable, "-c", BURN.format(seconds=1.5)])
    try:
        time.sleep(0.1)
        window = window_over(1.0)
    finally:
        child.wait()
    assert window.own_s >= 1.5 * window.window_s  # this process and its child's core
    assert not is_disturbed(oversubscribed(window))
