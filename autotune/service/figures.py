"""The figures a job's study carries for optuna-dashboard, which shows them beside its own
views (``optuna_dashboard.save_plotly_graph_object``): the metric against micro-batch per ZeRO
stage, peak memory against micro-batch with the device's limit, and the cost model's
prediction against what was measured.

They are drawn from the results directory (:func:`autotune.load_results`), rewritten after
every experiment while the job runs (the dashboard updates live), the prediction once the
job's cost model is final (``autotune plan --from`` predicts with it).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from autotune.metric import Metric

if TYPE_CHECKING:
    import optuna
    import pandas as pd
    from plotly.graph_objects import Figure

GIB = 2**30
OFFLOAD_COLUMN = "zero_optimization.offload_optimizer.device"
# The figures' ids in the study: the same id overwrites the figure, so a running job's are
# replaced as experiments finish.
METRIC_FIGURE, MEMORY_FIGURE, PREDICTION_FIGURE = "metric-vs-micro-batch", "memory", "prediction"


def update_figures(
    study: optuna.Study,
    results_dir: Path,
    metric: Metric,
    memory_limit_bytes: int | None,
    predicted: Mapping[str, float] | None = None,
) -> list[str]:
    """Draw the job's figures from ``results_dir`` into ``study``; the ids written. The
    prediction figure needs ``predicted`` (configuration name → the cost model's value)."""
    from optuna_dashboard import save_plotly_graph_object

    from autotune.results import load_results

    frame = load_results(results_dir)
    if frame.empty:
        return []
    figures = {
        METRIC_FIGURE: metric_figure(frame, metric),
        MEMORY_FIGURE: memory_figure(frame, memory_limit_bytes),
    }
    if predicted:
        figures[PREDICTION_FIGURE] = prediction_figure(frame, metric, predicted)
    for graph_id, figure in figures.items():
        save_plotly_graph_object(study, figure, graph_object_id=graph_id)
    return list(figures)


def predictions(results_dir: Path) -> dict[str, float]:
    """What the cost model a finished ``model_based`` job fitted predicts for each
    configuration it could run (name → the metric), as ``autotune plan --from`` plans it;
    empty for other tuners or where it cannot plan (a script whose model was not measured)."""
    from autotune.config import ConfigError
    from autotune.planning import PlanRequest, make_plan
    from autotune.workloads import WorkloadError

    try:
        planned = make_plan(PlanRequest(from_dir=results_dir))
    except (ConfigError, WorkloadError):
        return {}
    metric = Metric(_recorded_metric(results_dir))
    values = {
        Metric.throughput: lambda row: row.throughput,
        Metric.latency: lambda row: row.latency,
        Metric.flops: lambda row: row.tflops_per_gpu * 1e12,  # the metric is FLOP/s per rank
    }[metric]
    return {row.name: float(values(row)) for row in planned.rows if row.fits}


def metric_figure(frame: pd.DataFrame, metric: Metric) -> Figure:
    """The metric against micro-batch, one line per ZeRO variant; failures marked at zero."""
    import plotly.graph_objects as go

    figure = go.Figure()
    for label, rows in _by_variant(frame):
        ok = rows[rows["status"] == "ok"].sort_values("micro_batch_size")
        failed = rows[rows["status"] != "ok"]
        figure.add_trace(
            go.Scatter(
                x=ok["micro_batch_size"],
                y=ok[metric.value],
                mode="lines+markers",
                name=label,
                text=ok["name"],
            )
        )
        if not failed.empty:
            figure.add_trace(
                go.Scatter(
                    x=failed["micro_batch_size"],
                    y=[0] * len(failed),
                    mode="markers",
                    marker={"symbol": "x", "size": 10},
                    name=f"{label}: failed",
                    text=failed["status"] + ": " + failed["name"],
                )
            )
    figure.update_layout(
        title=f"{metric.label} against micro-batch, by ZeRO stage",
        xaxis={"title": "micro-batch per rank", "type": "log"},
        yaxis={"title": metric.label},
    )
    return figure


def memory_figure(frame: pd.DataFrame, limit_bytes: int | None) -> Figure:
    """Peak memory per rank against micro-batch, one line per ZeRO variant, and the device's
    limit (the per-rank budget) as a line across."""
    import plotly.graph_objects as go

    figure = go.Figure()
    for label, rows in _by_variant(frame):
        measured = rows[rows["peak_memory_bytes"].notna()].sort_values("micro_batch_size")
        figure.add_trace(
            go.Scatter(
                x=measured["micro_batch_size"],
                y=measured["peak_memory_bytes"] / GIB,
                mode="lines+markers",
                name=label,
                text=measured["status"] + ": " + measured["name"],
            )
        )
    if limit_bytes:
        figure.add_hline(
            y=limit_bytes / GIB,
            line_dash="dash",
            annotation_text=f"device limit {limit_bytes / GIB:.3g} GiB",
        )
    figure.update_layout(
        title="peak memory per rank against micro-batch, with the device's limit",
        xaxis={"title": "micro-batch per rank", "type": "log"},
        yaxis={"title": "peak memory per rank (GiB)"},
    )
    return figure


def prediction_figure(
    frame: pd.DataFrame, metric: Metric, predicted: Mapping[str, float]
) -> Figure:
    """Measured against predicted, one point per experiment that ran ok (re-measurements at
    their configuration's prediction), and the line where they agree."""
    import plotly.graph_objects as go

    ok = frame[frame["status"] == "ok"]
    configuration = ok["repeat_of"].where(ok["repeat_of"].notna(), ok["name"])
    points = [
        (predicted[str(c)], float(m), str(n))
        for c, m, n in zip(configuration, ok[metric.value], ok["name"], strict=True)
        if str(c) in predicted and math.isfinite(predicted[str(c)])
    ]
    figure = go.Figure()
    if points:
        xs, ys, names = zip(*points, strict=True)
        figure.add_trace(go.Scatter(x=xs, y=ys, mode="markers", name="experiments", text=names))
        low, high = min(*xs, *ys), max(*xs, *ys)
        figure.add_trace(
            go.Scatter(x=[low, high], y=[low, high], mode="lines", name="prediction = measurement")
        )
    figure.update_layout(
        title=f"the cost model's prediction against the measured {metric.label}",
        xaxis={"title": f"predicted {metric.label}"},
        yaxis={"title": f"measured {metric.label}"},
    )
    return figure


def _by_variant(frame: pd.DataFrame) -> list[tuple[str, pd.DataFrame]]:
    """The frame's rows by ZeRO variant (stage, and the optimizer's offload), stage order."""
    offload = (
        frame[OFFLOAD_COLUMN].fillna("none").astype(str)
        if OFFLOAD_COLUMN in frame
        else frame["zero_stage"].map(lambda _: "none")
    )
    labels = [
        f"ZeRO {int(stage)}" + ("" if where in ("none", "") else f", optimizer on {where}")
        for stage, where in zip(frame["zero_stage"], offload, strict=True)
    ]
    keyed = frame.assign(_variant=labels)
    return [(str(label), rows) for label, rows in keyed.groupby("_variant", sort=True)]


def _recorded_metric(results_dir: Path) -> str:
    from autotune.results import ResultsDir

    return ResultsDir(results_dir).ranked_metric().value


def memory_limit(fingerprint: Mapping[str, Any]) -> int | None:
    """The per-rank memory budget a job ran with, from its fingerprint."""
    budget = fingerprint.get("tuned", {}).get("device_memory_bytes")
    return int(budget) if budget else None
