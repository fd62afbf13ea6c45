"""Whether other processes competed for the cores an experiment's ranks ran on.

A measurement ranks configurations only if the machine under it was the same for all of them.
On a shared machine it is not: a neighbour's job, a build, Ray's own start-up take cores for a
while, and whatever ran then measures slow (on 2 cores, one busy process for 40 s put the
ZeRO stages it overlapped at 0.62-0.76 of the others). Each rank reads its node's CPU
accounting over its profile window (``/proc/stat``: every CPU's busy and stolen time) and its
own CPU time; together the ranks of a node say how much CPU *other* processes used meanwhile.
Against the cores the ranks were given, that is how oversubscribed the node was:
``(threads the ranks run + cores others used) / cores - 1``, 0 when everything fit. The tuner
ranks a configuration on its undisturbed measurements where it has any and measures the
disturbed ones again (see :mod:`autotune.tuner.ranking`).

Only CPU is seen: a GPU slowed by another job or by its clocks shows no trace here (the
tuner's final race, which re-measures every variant's best interleaved, covers that drift).
Linux only; elsewhere nothing is measured and nothing is flagged.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

# A measurement is disturbed when the node was oversubscribed by more than this share of its
# cores: a quarter of a core on a 2-core machine. Ray's own idle processes and the driver stay
# well under it (measured here: 0.01-0.04 cores).
DISTURBED_OVERSUBSCRIPTION = 0.1
_STAT = "/proc/stat"
# /proc/stat's cpu columns that are time the CPU did not give to idle: user, nice, system,
# irq, softirq and steal (a hypervisor's other guests), by position after the "cpu" label.
_BUSY_COLUMNS = (0, 1, 2, 5, 6, 7)


@dataclass(frozen=True)
class CpuSample:
    """CPU time so far: the node's busy time over all its CPUs and this process's own."""

    node_busy_s: float
    own_s: float
    node_cores: int
    at_s: float  # time.monotonic()


def sample_cpu() -> CpuSample | None:
    """Now's CPU accounting, or None where ``/proc/stat`` is not there to read."""
    try:
        with open(_STAT) as stat:
            lines = stat.read().splitlines()
    except OSError:
        return None
    ticks = os.sysconf("SC_CLK_TCK")
    total = lines[0].split()[1:]
    busy = sum(int(total[i]) for i in _BUSY_COLUMNS if i < len(total))
    cores = sum(1 for line in lines if line.startswith("cpu") and line[3:4].isdigit())
    return CpuSample(busy / ticks, _tree_cpu_ticks(os.getpid()) / ticks, cores, time.monotonic())


def _tree_cpu_ticks(root: int) -> int:
    """CPU ticks of ``root`` and every live process below it, plus the children it reaped:
    a script's data-loader workers are the experiment's own work, not a neighbour's."""
    parent_of: dict[int, int] = {}
    ticks_of: dict[int, int] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat") as stat:
                # After the command's closing parenthesis: state, ppid, ... (man 5 proc).
                fields = stat.read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue  # gone meanwhile
        pid = int(entry.name)
        parent_of[pid] = int(fields[1])
        utime, stime, cutime, cstime = (int(f) for f in fields[11:15])
        ticks_of[pid] = utime + stime + (cutime + cstime if pid == root else 0)
    total = 0
    for pid, ticks in ticks_of.items():
        ancestor = pid
        while ancestor > 1 and ancestor != root:
            ancestor = parent_of.get(ancestor, 0)
        if ancestor == root:
            total += ticks
    return total


@dataclass(frozen=True)
class WindowCpu:
    """What one rank saw of its node's CPUs over its profile window, in seconds."""

    host: str
    node_busy_s: float
    own_s: float
    node_cores: int
    window_s: float

    @classmethod
    def between(cls, start: CpuSample | None, end: CpuSample | None) -> WindowCpu | None:
        if start is None or end is None or end.at_s <= start.at_s:
            return None
        return cls(
            host=socket.gethostname(),
            node_busy_s=end.node_busy_s - start.node_busy_s,
            own_s=end.own_s - start.own_s,
            node_cores=end.node_cores,
            window_s=end.at_s - start.at_s,
        )

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def oversubscription(
    windows: Iterable[Mapping[str, Any] | None], threads_per_rank: int
) -> float | None:
    """How far the busiest node's cores were oversubscribed during the window (0: not at all),
    from every rank's :class:`WindowCpu` (as dicts); None if any rank measured nothing.

    Per host, other processes used the node's busy time less what its ranks used; the ranks
    needed ``threads_per_rank`` cores each.

    Example:
        >>> rank = {"host": "a", "node_busy_s": 3.0, "own_s": 1.0, "node_cores": 2,
        ...         "window_s": 1.0}
        >>> oversubscription([rank, rank], threads_per_rank=1)   # others used 1 of 2 cores
        0.5
        >>> quiet = {**rank, "node_busy_s": 2.0}
        >>> oversubscription([quiet, quiet], threads_per_rank=1)
        0.0
    """
    by_host: dict[str, list[Mapping[str, Any]]] = {}
    for window in windows:
        if window is None:
            return None
        by_host.setdefault(str(window["host"]), []).append(window)
    if not by_host:
        return None
    worst = 0.0
    for ranks in by_host.values():
        window_s = max(float(r["window_s"]) for r in ranks)
        others_s = max(float(r["node_busy_s"]) for r in ranks) - sum(
            float(r["own_s"]) for r in ranks
        )
        demand_cores = threads_per_rank * len(ranks) + max(0.0, others_s) / window_s
        cores = max(int(r["node_cores"]) for r in ranks)
        worst = max(worst, demand_cores / cores - 1.0)
    return round(worst, 3)


def is_disturbed(oversubscribed: float | None) -> bool:
    """Whether a window this oversubscribed measured the machine, not the configuration."""
    return oversubscribed is not None and oversubscribed > DISTURBED_OVERSUBSCRIPTION


def others_cores(start: CpuSample, end: CpuSample) -> float | None:
    """The cores processes other than this one's tree kept busy between two samples, on
    average (None: no time passed). The tree is this process and everything it started: the
    driver, a Ray cluster it started and that cluster's actors."""
    seconds = end.at_s - start.at_s
    if seconds <= 0:
        return None
    busy = (end.node_busy_s - start.node_busy_s) - (end.own_s - start.own_s)
    return max(0.0, busy) / seconds


def leaves_room(others: float, demand_cores: float, node_cores: int) -> bool:
    """Whether ranks that need ``demand_cores`` would measure undisturbed beside ``others``
    busy cores (:data:`DISTURBED_OVERSUBSCRIPTION`)."""
    cores = max(node_cores, 1)
    return (min(demand_cores, cores) + others) / cores - 1.0 <= DISTURBED_OVERSUBSCRIPTION


def wait_for_quiet(
    timeout_s: float,
    demand_cores: float,
    *,
    interval_s: float = 1.0,
    sample: Callable[[], CpuSample | None] = sample_cpu,
    sleep: Callable[[float], None] = time.sleep,
) -> bool:
    """Watch this node for up to ``timeout_s`` until other processes leave room for an
    experiment whose ranks need ``demand_cores`` (:func:`leaves_room`): True as soon as one
    ``interval_s`` did, False if it stayed busy (or there is nothing to read: not Linux).
    This process's own tree is not a neighbour (:func:`others_cores`).

    Example:
        >>> samples = iter([CpuSample(0, 0, 2, 0), CpuSample(1, 0, 2, 1),   # 1 core busy
        ...                 CpuSample(1.05, 0.01, 2, 2)])                   # then quiet
        >>> wait_for_quiet(5, 2, sample=lambda: next(samples), sleep=lambda s: None)
        True
    """
    last = sample()
    if last is None:
        return False
    waited = 0.0
    while waited < timeout_s:
        sleep(min(interval_s, timeout_s - waited))  # not past the time it said it would wait
        now = sample()
        others = others_cores(last, now) if now is not None else None
        if now is None or others is None:
            return False
        if leaves_room(others, demand_cores, now.node_cores):
            return True
        waited += now.at_s - last.at_s
        last = now
    return False
