"""The metric registry: every Metric says its name, unit, label and direction, and reads and
shows a measurement consistently with what the engine measures."""

from __future__ import annotations

import pytest

from autotune.config import load_config
from autotune.experiment import Metrics
from autotune.metric import Metric


@pytest.mark.parametrize("metric", list(Metric))
def test_every_metric_has_a_unit_a_label_and_a_direction(metric: Metric) -> None:
    assert metric.unit and metric.label == f"{metric.value} ({metric.unit})"
    # Its direction decides which of two measurements is the better one.
    better, worse = (1.0, 2.0) if metric.lower_is_better else (2.0, 1.0)
    assert metric.score(better) > metric.score(worse) and metric.best([worse, better]) == better
    measured = Metrics.from_window([0.5, 0.5], 8, 2e9, peak_memory_bytes=0)
    value = metric.of(measured)
    assert value == getattr(measured, metric.value) == metric.of(measured.to_dict())
    number, unit = metric.display(value).split(" ", 1)
    assert float(number) > 0 and "/" in unit
    assert load_config({"autotuning": {"metric": metric.value.upper()}}).autotuning.metric is metric


@pytest.mark.parametrize("metric", list(Metric))
def test_the_faster_window_is_better_by_every_metric(metric: Metric) -> None:
    fast = Metrics.from_window([0.4, 0.4], 8, 1e9, peak_memory_bytes=0)
    slow = Metrics.from_window([0.5, 0.5], 8, 1e9, peak_memory_bytes=0)
    assert metric.score(metric.of(fast)) > metric.score(metric.of(slow))
    assert metric.best([metric.of(slow), metric.of(fast)]) == metric.of(fast)


def test_each_metric_is_shown_in_its_unit() -> None:
    assert Metric.throughput.display(12.345) == "12.35 samples/s"
    assert Metric.latency.display(0.5) == "0.500 s/step"
    assert Metric.flops.display(2.5e9) == "2.50 GFLOP/s"
    assert [m.lower_is_better for m in Metric] == [False, True, False]
