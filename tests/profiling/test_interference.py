"""Other processes competing for the ranks' cores are seen in the window's CPU accounting;
the rank's own children are its own work."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import replace

import pytest

from autotune.profiling.interference import (
    CpuSample,
    WindowCpu,
    is_disturbed,
    oversubscription,
    sample_cpu,
    wait_for_quiet,
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


def cpu_s(pid: int) -> float:
    """CPU seconds ``pid`` has used so far, by its own accounting (``/proc/<pid>/stat``)."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def oversubscribed(window: WindowCpu, own_s: float | None = None) -> float:
    # One rank asking for all the node's cores: anything others use oversubscribes it.
    counted = window if own_s is None else replace(window, own_s=own_s)
    busy = oversubscription([counted.to_dict()], threads_per_rank=window.node_cores)
    assert busy is not None
    return busy


# Each process's CPU time is read a moment apart from the node's; a few clock ticks apart.
SLACK_S = 0.05

# These tests run beside other jobs (a neighbour's test suite holds both cores for minutes),
# so a verdict is never compared with a quiet window taken earlier: on a saturated node one
# more busy process barely moves the node's busy time. What they check instead holds at any
# load: each process's CPU time, by its own accounting, is counted on the side it belongs to.


def test_a_neighbour_burning_a_core_oversubscribes_the_ranks() -> None:
    # Detached (its parent exits at once): not this process's descendant, a neighbour.
    started = subprocess.run(
        ["sh", "-c", f"{sys.executable} -c '{BURN.format(seconds=1.5)}' >/dev/null 2>&1 & echo $!"],
        check=True,
        capture_output=True,
        text=True,
    )
    neighbour = int(started.stdout)
    time.sleep(0.1)
    before = cpu_s(neighbour)
    window = window_over(1.0)
    neighbour_s = cpu_s(neighbour) - before
    time.sleep(0.5)  # the neighbour's end, before anything else measures
    others_s = window.node_busy_s - window.own_s
    # All the neighbour's CPU time is others', none of it the ranks' own...
    assert others_s >= neighbour_s - SLACK_S, (others_s, neighbour_s)
    # ...and the window is disturbed: by the neighbour alone on a quiet node (half a core of
    # two), by it and the rest of the load on a busy one.
    busy = oversubscribed(window)
    assert is_disturbed(busy), (busy, neighbour_s, window)
    # Counting the neighbour as the ranks' own work would have hidden what it took.
    as_own = oversubscribed(window, own_s=window.own_s + neighbour_s)
    assert busy - as_own >= neighbour_s / window.window_s / window.node_cores - SLACK_S


def test_the_ranks_own_children_are_their_work_not_a_neighbours() -> None:
    child = subprocess.Popen([sys.executable, "-c", BURN.format(seconds=1.5)])
    try:
        time.sleep(0.1)
        before_child, before_self = cpu_s(child.pid), cpu_s(os.getpid())
        window = window_over(1.0)
        child_s, self_s = cpu_s(child.pid) - before_child, cpu_s(os.getpid()) - before_self
    finally:
        child.wait()
    # This process and its child, by their own accounting, are the window's own time...
    assert window.own_s >= self_s + child_s - SLACK_S, (window.own_s, self_s, child_s)
    # ...so the child's core does not oversubscribe the ranks: the verdict is what it would
    # be without the child, whatever the neighbours did meanwhile.
    busy = oversubscribed(window)
    as_neighbour = oversubscribed(window, own_s=window.own_s - child_s)
    assert as_neighbour - busy >= child_s / window.window_s / window.node_cores - SLACK_S


def test_waiting_for_quiet_gives_up_while_neighbours_hold_the_cores() -> None:
    # Two detached neighbours burning a core each for longer than the wait: the node stays
    # too busy for ranks that need every core (at any other load too).
    # Detached, as in the first test: not this process's descendants.
    burn = f"{sys.executable} -c '{BURN.format(seconds=5)}' >/dev/null 2>&1 &"
    subprocess.run(["sh", "-c", f"{burn} {burn}"], check=True)
    time.sleep(0.3)
    started = time.monotonic()
    assert not wait_for_quiet(1.5, os.cpu_count() or 1, interval_s=0.5)
    assert 1.4 <= time.monotonic() - started < 4.5
    time.sleep(max(0.0, started + 5.0 - time.monotonic()))  # their end, before anything else


def test_waiting_for_quiet_on_a_machine_it_cannot_read_does_not_wait() -> None:
    slept: list[float] = []
    assert not wait_for_quiet(10, 2, sample=lambda: None, sleep=slept.append)
    assert slept == []


def test_waiting_for_quiet_waits_no_longer_than_it_said() -> None:
    clock = [0.0]

    def sample() -> CpuSample:  # every core busy with others' work, all along
        return CpuSample(clock[0] * 2, 0.0, 2, clock[0])

    def sleep(seconds: float) -> None:
        clock[0] += seconds

    assert not wait_for_quiet(2.5, 2, sample=sample, sleep=sleep)
    assert clock[0] == pytest.approx(2.5)
