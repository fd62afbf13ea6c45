"""The metrics a tuning run ranks by: each one's name, unit, label, direction, how to read it.

One registry for every place that shows or compares a metric: the live display and the
final table (display.py), ``autotune report`` (cli.py), the plots (results/plots.py), the
results table's columns (results/frame.py) and the tuner's ranking. The meanings are
DeepSpeed's, measured end to end over the profile window (see
:class:`autotune.experiment.Metrics`). Pure: no torch, no pandas.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

PEAK_MEMORY_COLUMN = "peak_memory_bytes"
PEAK_MEMORY_LABEL = "peak memory per rank"
"""Shown next to every metric; the ranking breaks ties on it. Not rankable itself."""


@dataclass(frozen=True)
class _Facts:
    unit: str
    lower_is_better: bool
    display_scale: float  # values are shown divided by this, in display_unit
    display_unit: str
    display_digits: int


class Metric(str, enum.Enum):
    """What a tuning run optimises (``autotuning.metric``, ``--metric``).

    Its value is its name everywhere: the ``autotuning.metric`` key, the attribute of
    :class:`autotune.experiment.Metrics` and of a log record's ``metrics``, and the column of
    :func:`autotune.load_results`.

    Example:
        >>> Metric.latency.label, Metric.latency.lower_is_better
        ('latency (s/step)', True)
        >>> Metric.flops.display(2.5e9)
        '2.50 GFLOP/s'
        >>> Metric.throughput.of({"throughput": 12.0}), Metric.latency.best([0.5, 0.4])
        (12.0, 0.4)
    """

    throughput = "throughput"
    latency = "latency"
    flops = "flops"

    @property
    def _facts(self) -> _Facts:
        return _FACTS[self.value]

    @property
    def unit(self) -> str:
        """What a value counts: ``samples/s`` (global), ``s/step``, ``FLOP/s per rank``."""
        return self._facts.unit

    @property
    def label(self) -> str:
        """Name and unit, for a table's column or a plot's axis: ``throughput (samples/s)``."""
        return f"{self.value} ({self.unit})"

    @property
    def lower_is_better(self) -> bool:
        """Latency is minimised; throughput and FLOPS are maximised (DeepSpeed's autotuner
        maximises latency too, a bug not copied here)."""
        return self._facts.lower_is_better

    def of(self, measured: Any) -> float:
        """This metric's value read off a :class:`~autotune.experiment.Metrics`, a log
        record's ``metrics`` mapping, or a row of :func:`autotune.load_results`."""
        if isinstance(measured, Mapping):
            return float(measured[self.value])
        return float(getattr(measured, self.value))

    def score(self, value: float) -> float:
        """``value`` oriented so that higher is better (latency is negated)."""
        return -value if self.lower_is_better else value

    def step_time_s(self, value: float, train_batch_size: int, flops_per_step: float) -> float:
        """The seconds an optimizer step takes where this metric reads ``value``: a global
        batch of ``train_batch_size`` samples, ``flops_per_step`` FLOPs a rank.

        Example:
            >>> Metric.throughput.step_time_s(32.0, 16, 0.0)
            0.5
        """
        if self is Metric.latency:
            return value
        if self is Metric.throughput:
            return train_batch_size / value
        return flops_per_step / value

    def best(self, values: Iterable[float]) -> float:
        """The best of ``values``: the smallest latency, the largest throughput or FLOPS."""
        return min(values) if self.lower_is_better else max(values)

    def display(self, value: float) -> str:
        """``value`` for a person: ``12.34 samples/s``, ``0.512 s/step``, ``2.50 GFLOP/s``."""
        facts = self._facts
        shown = value / facts.display_scale
        return f"{shown:.{facts.display_digits}f} {facts.display_unit}"


_FACTS: dict[str, _Facts] = {
    Metric.throughput.value: _Facts("samples/s", False, 1.0, "samples/s", 2),
    Metric.latency.value: _Facts("s/step", True, 1.0, "s/step", 3),
    Metric.flops.value: _Facts("FLOP/s per rank", False, 1e9, "GFLOP/s", 2),
}
