"""Ranking results: which configuration is best, by how much, and whether noise could flip it.

Each metric's direction is its :class:`~autotune.metric.Metric`'s (latency: lower is better).
Only ``ok`` results rank. Re-measurements (``<name>_r1``, ...) are grouped with their original
and a configuration ranks by the median of its measurements; ties go to the lower peak memory.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable
from dataclasses import dataclass

from autotune.config import Metric
from autotune.experiment import ExperimentResult, Metrics
from autotune.tuner.naming import split_repeat


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
        value: the median of the metric over its ok measurements.
        values: every ok measurement, original first.
        peak_memory_bytes: the largest peak memory per rank over its measurements.
    """

    name: str
    value: float
    values: tuple[float, ...]
    peak_memory_bytes: int

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
        }


def rank(results: Iterable[ExperimentResult], metric: Metric) -> list[Ranked]:
    """Configurations that ran ok, best first.

    Example:
        >>> from autotune.experiment import Status
        >>> def result(name, latency):
        ...     m = Metrics.from_window([latency], 8, 1e9, peak_memory_bytes=0)
        ...     return ExperimentResult(name, Status.ok, m)
        >>> ranked = rank([result("a", 2.0), result("b", 1.0), result("b_r1", 3.0)],
        ...               Metric.latency)
        >>> [(r.name, r.value) for r in ranked]
        [('a', 2.0), ('b', 2.0)]
    """
    groups: dict[str, list[Metrics]] = {}
    for result in results:
        if result.ok and result.metrics is not None:
            groups.setdefault(split_repeat(result.name)[0], []).append(result.metrics)
    ranked = [
        Ranked(
            name=name,
            value=statistics.median(metric.of(m) for m in measured),
            values=tuple(metric.of(m) for m in measured),
            peak_memory_bytes=max(m.peak_memory_bytes for m in measured),
        )
        for name, measured in groups.items()
    ]
    ranked.sort(key=lambda r: (-metric.score(r.value), r.peak_memory_bytes, r.name))
    return ranked


def within_noise(first: Ranked, second: Ranked) -> bool:
    """True when the two configurations' measured ranges overlap: the order could be noise.

    Example:
        >>> within_noise(Ranked("a", 10, (9, 10, 12), 0), Ranked("b", 8.5, (8, 8.5, 9.5), 0))
        True
    """
    return min(first.values) <= max(second.values) and min(second.values) <= max(first.values)
