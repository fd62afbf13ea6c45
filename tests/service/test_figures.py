"""The figures a job draws into its study for optuna-dashboard, from a results frame."""

from __future__ import annotations

import pandas as pd
import pytest

from autotune.metric import Metric

pytest.importorskip("plotly")

from autotune.service import figures

FRAME = pd.DataFrame(
    {
        "name": ["z1_mbs8", "z1_mbs16", "z2_mbs16", "z2_mbs32", "z1_mbs8_r1"],
        "status": ["ok", "ok", "ok", "oom", "ok"],
        "zero_stage": [1, 1, 2, 2, 1],
        "micro_batch_size": [8, 16, 16, 32, 8],
        "throughput": [10.0, 18.0, 17.0, None, 11.0],
        "peak_memory_bytes": [1 << 28, 1 << 29, 1 << 28, None, 1 << 28],
        "repeat_of": [None, None, None, None, "z1_mbs8"],
        figures.OFFLOAD_COLUMN: [None, None, None, None, None],
    }
)


def test_the_metric_per_stage_with_the_failures_marked() -> None:
    figure = figures.metric_figure(FRAME, Metric.throughput)
    names = [trace.name for trace in figure.data]
    assert names == ["ZeRO 1", "ZeRO 2", "ZeRO 2: failed"]
    assert list(figure.data[0].x) == [8, 8, 16]  # sorted by micro-batch, the repeat too
    assert "by ZeRO stage" in figure.layout.title.text


def test_memory_with_the_device_limit() -> None:
    figure = figures.memory_figure(FRAME, 1 << 30)
    assert [trace.name for trace in figure.data] == ["ZeRO 1", "ZeRO 2"]
    (limit,) = figure.layout.shapes
    assert limit.y0 == 1.0  # GiB


def test_predicted_against_measured_puts_a_repeat_at_its_configurations_prediction() -> None:
    predicted = {"z1_mbs8": 9.0, "z1_mbs16": 20.0, "z2_mbs16": 16.0}
    figure = figures.prediction_figure(FRAME, Metric.throughput, predicted)
    points = figure.data[0]
    assert sorted(zip(points.x, points.y, strict=True)) == [
        (9.0, 10.0),
        (9.0, 11.0),
        (16.0, 17.0),
        (20.0, 18.0),
    ]
