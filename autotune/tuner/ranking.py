"""Ranking results: which configuration is best, by how much, and whether noise could flip it.

Each metric's direction is its :class:`~autotune.metric.Metric`'s (latency: lower is better).
Only ``ok`` results rank. Re-measurements are grouped with their configuration (the run that
measured it first, as the record says) and a configuration ranks by the median of its
measurements; ties go to the lower peak memory.
A measurement taken while other processes competed for the ranks' cores (``disturbed``, see
:mod:`autotune.profiling.interference`) counts only for a configuration that has no other.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from autotune.config import Metric
from autotune.experiment import ExperimentResult, Metrics

# Configurations within 2% of each other are as good as each other: more experiments to tell
# them apart do not pay, and an answer within 2% of the best is the answer.
TOLERANCE = 0.02


def score(metrics: Metrics, metric: Metric) -> float:
    """``metric`` oriented so that higher is better (latency is negated).

    Example:
        >>> m = Metrics.from_window([0.5, 0.5], train_batch_size=8, flops_per_step=1e9,
        ...                         peak_memory_bytes=0)
        >>> score(m, Metric.latency), score(m, Metric.throughput)
        (-0.5, 16.0)
    """
    return metric.score(metric.of(metrics))


@dataclass(frozen=True)
class Ranked:
    """One configuration's standing: the median of its measurements and their spread.

    Attributes:
        name: the configuration's name (of its original measurement).
        value: the median of the metric over the measurements it ranks on.
        values: the ok measurements it ranks on, original first: the undisturbed ones, or
            every one when all were disturbed.
        peak_memory_bytes: the largest peak memory per rank over its measurements.
        num_disturbed: its measurements taken while other processes competed for the cores.
        disturbed: whether it ranks on disturbed measurements, having no other (its value is
            then too low a guess of what it measures on a quiet machine).
        runs: the experiments ``values`` were measured in, in the same order: what a table
            folds its other columns over, so that they describe the same runs.
    """

    name: str
    value: float
    values: tuple[float, ...]
    peak_memory_bytes: int
    num_disturbed: int = 0
    disturbed: bool = False
    runs: tuple[str, ...] = ()

    @property
    def num_undisturbed(self) -> int:
        return 0 if self.disturbed else len(self.values)

    @property
    def spread(self) -> float:
        """(largest − smallest) / median: 0.1 means the measurements varied by 10%."""
        return (max(self.values) - min(self.values)) / self.value if self.value else 0.0

    @property
    def num_measurements(self) -> int:
        return len(self.values)

    def to_dict(self) -> dict[str, object]:
        return {
            "name": self.name,
            "value": self.value,
            "values": list(self.values),
            "spread": self.spread,
            "peak_memory_bytes": self.peak_memory_bytes,
            "num_disturbed": self.num_disturbed,
            "disturbed": self.disturbed,
            "runs": list(self.runs),
        }


@dataclass(frozen=True)
class Measurement:
    """One ok measurement of a configuration, as a ranking reads it.

    Attributes:
        config: the configuration's name (a re-measurement's original).
        value: the metric measured.
        peak_memory_bytes: the peak memory per rank measured.
        disturbed: taken while other processes competed for the ranks' cores.
        run: the experiment that measured it (``z2_mbs4_r1``).
    """

    config: str
    value: float
    peak_memory_bytes: int
    disturbed: bool = False
    run: str = ""


def measurements(
    results: Iterable[ExperimentResult],
    metric: Metric,
    repeat_of: Mapping[str, str | None] | None = None,
) -> list[Measurement]:
    """The ok results as measurements of their configurations: a re-measurement's is the one
    ``repeat_of`` names for it (by experiment name), any other experiment's its own."""
    repeats = repeat_of or {}
    return [
        Measurement(
            repeats.get(r.name) or r.name,
            metric.of(r.metrics),
            r.metrics.peak_memory_bytes,
            r.metrics.disturbed,
            r.name,
        )
        for r in results
        if r.ok and r.metrics is not None
    ]


def rank_measurements(measured: Iterable[Measurement], metric: Metric) -> list[Ranked]:
    """Configurations by the median of their measurements, best first (undisturbed ones
    only, where a configuration has any); ties go to the lower peak memory, then the name.

    Example:
        >>> ranked = rank_measurements([Measurement("a", 10, 0), Measurement("a", 6, 0, True),
        ...                             Measurement("b", 7, 0, True)], Metric.throughput)
        >>> [(r.name, r.value, r.num_disturbed, r.disturbed) for r in ranked]
        [('a', 10, 1, False), ('b', 7, 1, True)]
    """
    groups: dict[str, list[Measurement]] = {}
    for measurement in measured:
        groups.setdefault(measurement.config, []).append(measurement)
    ranked = []
    for name, group in groups.items():
        used = [m for m in group if not m.disturbed] or group
        ranked.append(
            Ranked(
                name=name,
                value=statistics.median(m.value for m in used),
                values=tuple(m.value for m in used),
                peak_memory_bytes=max(m.peak_memory_bytes for m in group),
                num_disturbed=sum(1 for m in group if m.disturbed),
                disturbed=all(m.disturbed for m in used),
                runs=tuple(m.run for m in used),
            )
        )
    ranked.sort(key=lambda r: (-metric.score(r.value), r.peak_memory_bytes, r.name))
    return ranked


def rank(
    results: Iterable[ExperimentResult],
    metric: Metric,
    repeat_of: Mapping[str, str | None] | None = None,
) -> list[Ranked]:
    """Configurations that ran ok, best first by the median of their measurements; a
    re-measurement counts for the configuration ``repeat_of`` names for it.

    Example:
        >>> from autotune.experiment import Status
        >>> def result(name, latency):
        ...     m = Metrics.from_window([latency], 8, 1e9, peak_memory_bytes=0)
        ...     return ExperimentResult(name, Status.ok, m)
        >>> ranked = rank([result("a", 2.0), result("b", 1.0), result("b again", 3.0)],
        ...               Metric.latency, repeat_of={"b again": "b"})
        >>> [(r.name, r.value) for r in ranked]
        [('a', 2.0), ('b', 2.0)]
    """
    return rank_measurements(measurements(results, metric, repeat_of), metric)


def within_noise(first: Ranked, second: Ranked) -> bool:
    """True when the two configurations' measured ranges overlap: the order could be noise.

    Example:
        >>> within_noise(Ranked("a", 10, (9, 10, 12), 0), Ranked("b", 8.5, (8, 8.5, 9.5), 0))
        True
    """
    return min(first.values) <= max(second.values) and min(second.values) <= max(first.values)


def relative_noise(ranked: Iterable[Ranked]) -> float | None:
    """The run-to-run noise of one measurement, relative: the pooled standard deviation of the
    log of each configuration's measurements (configurations measured at least twice).

    Pooling borrows strength across configurations: two or three repeats each say little
    alone, a dozen configurations' repeats together say how noisy this machine is. None when
    nothing was measured twice.

    Example:
        >>> round(relative_noise([Ranked("a", 10, (9, 10, 11), 0), Ranked("b", 5, (5,), 0)]), 3)
        0.1
    """
    squares, degrees = 0.0, 0
    for r in ranked:
        values = [math.log(v) for v in r.values if v > 0]
        if len(values) < 2:
            continue
        mean = statistics.fmean(values)
        squares += sum((v - mean) ** 2 for v in values)
        degrees += len(values) - 1
    return math.sqrt(squares / degrees) if degrees else None


def race_can_settle(
    leader: Ranked, other: Ranked, noise: float, *, tolerance: float, max_measurements: int
) -> bool:
    """Whether racing ``other`` against ``leader`` up to ``max_measurements`` measurements
    each can still tell them apart: False for a rival within ``tolerance`` of the leader on a
    machine whose noise leaves the gap's uncertainty (see :func:`could_be_better`) above
    ``tolerance`` even then. Such a pair is a tie at this machine's noise, which more rounds
    would only confirm; a rival further off races on.

    Example:
        >>> lead, close = Ranked("a", 100, (95, 100, 105), 0), Ranked("b", 99, (94, 99, 104), 0)
        >>> behind = Ranked("c", 97, (92, 97, 102), 0)
        >>> kwargs = dict(tolerance=0.02, max_measurements=7)
        >>> race_can_settle(lead, close, 0.05, **kwargs)  # 5% noise: tied after 7 runs each
        False
        >>> race_can_settle(lead, behind, 0.05, **kwargs)  # 3% apart: more rounds may tell
        True
        >>> race_can_settle(lead, close, 0.01, **kwargs)  # 1% noise: they can be told apart
        True
    """
    if leader.value <= 0 or other.value <= 0:
        return False
    gap = abs(math.log(leader.value) - math.log(other.value))
    spread = 1.25 * noise * math.sqrt(2 / max_measurements)
    return spread <= tolerance or gap >= tolerance


def could_be_better(
    leader: Ranked, other: Ranked, noise: float, *, confidence_z: float, tolerance: float
) -> bool:
    """Whether ``other`` may still be better than ``leader`` by more than ``tolerance``.

    Compares the medians' gap (relative) with the uncertainty of the gap: a median of n
    measurements with relative noise s wanders by about 1.25 s / sqrt(n). ``other`` is out
    of the race once the gap exceeds ``confidence_z`` such uncertainties, or once the
    uncertainty itself is below ``tolerance`` (more repeats could only tell apart
    configurations within ``tolerance`` of each other, which is as good as a tie).

    Example:
        >>> lead, close = Ranked("a", 100, (95, 100, 105), 0), Ranked("b", 97, (92, 97, 99), 0)
        >>> far = Ranked("c", 60, (58, 60, 62), 0)
        >>> kwargs = dict(confidence_z=1.64, tolerance=0.01)
        >>> could_be_better(lead, close, 0.05, **kwargs), could_be_better(lead, far, 0.05, **kwargs)
        (True, False)
    """
    if leader.value <= 0 or other.value <= 0:
        return False
    gap = abs(math.log(leader.value) - math.log(other.value))
    spread = 1.25 * noise * math.sqrt(1 / leader.num_measurements + 1 / other.num_measurements)
    return spread > tolerance and gap < confidence_z * spread
