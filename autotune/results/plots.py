"""Plots of a results DataFrame (from :func:`load_results`) for notebooks and reports."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from autotune.metric import PEAK_MEMORY_COLUMN, PEAK_MEMORY_LABEL, Metric
from autotune.results.frame import fold_runs
from autotune.tuner.ranking import Measurement, rank_measurements

if TYPE_CHECKING:
    import pandas as pd
    from matplotlib.axes import Axes

GIB = 2**30
MEMORY_AXIS_LABEL = f"{PEAK_MEMORY_LABEL} (GiB)"


def _axes(ax: Axes | None) -> Axes:
    if ax is not None:
        return ax
    import matplotlib.pyplot as plt

    _, new_ax = plt.subplots(figsize=(6, 4))
    return new_ax


def _ok(frame: pd.DataFrame, metric: Metric = Metric.throughput) -> pd.DataFrame:
    """One row per configuration that ran ok, its repeats folded as the run's ranking folds
    them (over its undisturbed runs where it has any; see
    :func:`autotune.results.frame.fold_runs`), in the ranking's order by ``metric``."""
    import pandas as pd

    ok = frame[frame["status"] == "ok"]
    runs = {str(row["name"]): row for row in ok.to_dict("records")}
    rows = []
    for ranked in rank_measurements(_measurements(runs.values(), metric), metric):
        row = dict(runs.get(ranked.name) or runs[ranked.runs[0]])
        rows.append({**row, "name": ranked.name, **fold_runs(ranked, metric, runs)})
    return pd.DataFrame(rows, columns=list(ok.columns))


def _measurements(rows: Iterable[Mapping[str, Any]], metric: Metric) -> list[Measurement]:
    """The ok rows of a :func:`load_results` frame as the ranking's measurements."""
    return [
        Measurement(
            _configuration(row),
            float(row[metric.value]),
            int(row[PEAK_MEMORY_COLUMN]),
            bool(row.get("disturbed", False)),
            str(row["name"]),
        )
        for row in rows
        if row["status"] == "ok"
    ]


def _configuration(row: Mapping[str, Any]) -> str:
    """The configuration a frame's row measured (a re-measurement's ``repeat_of``; a frame
    holds NaN where a row has none)."""
    repeat_of = row.get("repeat_of")
    return repeat_of if isinstance(repeat_of, str) else str(row["name"])


def metric_vs_micro_batch(
    frame: pd.DataFrame, metric: Metric | str = Metric.throughput, ax: Axes | None = None
) -> Axes:
    """One line per ZeRO stage: the metric against the micro-batch size (best knobs each)."""
    metric = Metric(metric)
    ax = _axes(ax)
    ok = _ok(frame, metric)
    for stage, group in ok.groupby("zero_stage"):
        points = group.groupby("micro_batch_size")[metric.value].agg(metric.best).sort_index()
        ax.plot(points.index, points.values, marker="o", label=f"ZeRO {stage}")
    floor = float(ok[metric.value].min()) if len(ok) else 0.0
    _mark_failures(ax, frame, list(frame["micro_batch_size"]), floor)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("micro-batch size per rank")
    ax.set_ylabel(metric.label)
    ax.set_title(f"{metric.value} by micro-batch and stage" if len(ok) else "no experiment ran ok")
    if ax.get_legend_handles_labels()[0]:
        ax.legend()
    return ax


def best_so_far(
    frame: pd.DataFrame, metric: Metric | str = Metric.throughput, ax: Axes | None = None
) -> Axes:
    """The declared best after each experiment, by the run's one ranking (repeats folded,
    as summary.txt declares it), with every measurement and every failure: how fast the
    search paid off. Give it :func:`load_results`' frame in finishing order."""
    metric = Metric(metric)
    ax = _axes(ax)
    ok = frame["status"] == "ok"
    values = frame[metric.value].where(ok)
    numbers = list(range(1, len(frame) + 1))
    measured: list[Measurement] = []
    declared: list[float] = []
    for row in frame.to_dict("records"):
        measured += _measurements([row], metric)
        best = rank_measurements(measured, metric)
        declared.append(best[0].value if best else float("nan"))
    if ok.any():
        ax.step(numbers, declared, where="post", label="declared best so far")
        ax.scatter(numbers, values, s=12, alpha=0.6, label="experiment")
    _mark_failures(ax, frame, numbers, floor=float(values.min()) if ok.any() else 0.0)
    ax.set_xlabel("experiment number")
    ax.set_ylabel(metric.label)
    ax.set_title(f"best {metric.value} so far" if ok.any() else "no experiment ran ok")
    ax.legend()
    return ax


def _mark_failures(ax: Axes, frame: pd.DataFrame, xs: list[Any], floor: float) -> None:
    """A marker per failed experiment at ``floor``, one legend entry per status."""
    for status, marker in (("oom", "v"), ("error", "x"), ("timeout", "s")):
        failed = [x for x, s in zip(xs, frame["status"], strict=True) if s == status]
        if failed:
            ax.scatter(failed, [floor] * len(failed), marker=marker, color="red", label=status)


def pareto_front(frame: pd.DataFrame, metric: Metric | str = Metric.throughput) -> pd.DataFrame:
    """The configurations that ran ok that no other beats on both ``metric`` (in its
    direction: latency lower) and peak memory (lower), repeats folded as the ranking folds
    them."""
    metric = Metric(metric)
    ok = _ok(frame, metric)
    ok = ok.assign(_score=[metric.score(v) for v in ok[metric.value]])
    ok = ok.sort_values([PEAK_MEMORY_COLUMN, "_score"], ascending=[True, False])
    front: list[Any] = []
    best = float("-inf")
    for index, score in ok["_score"].items():
        if score > best:
            front.append(index)
            best = score
    return ok.loc[front].drop(columns="_score")


def metric_vs_memory(
    frame: pd.DataFrame, metric: Metric | str = Metric.throughput, ax: Axes | None = None
) -> Axes:
    """``metric`` against peak memory per rank, one colour per ZeRO stage, the Pareto front
    (:func:`pareto_front`) marked."""
    metric = Metric(metric)
    ax = _axes(ax)
    ok = _ok(frame, metric)
    for stage, group in ok.groupby("zero_stage"):
        ax.scatter(group[PEAK_MEMORY_COLUMN] / GIB, group[metric.value], label=f"ZeRO {stage}")
    front = pareto_front(frame, metric)
    ax.plot(
        front[PEAK_MEMORY_COLUMN] / GIB,
        front[metric.value],
        color="black",
        linestyle="--",
        marker="*",
        markersize=10,
        label="Pareto front",
    )
    ax.set_xlabel(MEMORY_AXIS_LABEL)
    ax.set_ylabel(metric.label)
    if ok.empty:  # nothing measured memory: say what happened instead of empty axes
        counts = frame["status"].value_counts()
        said = ", ".join(f"{count} {status}" for status, count in counts.items())
        ax.text(
            0.5,
            0.5,
            f"no experiment ran ok ({said or 'none ran'})",
            ha="center",
            transform=ax.transAxes,
        )
        ax.set_title("no experiment ran ok")
        return ax
    ax.set_title(f"{metric.value} vs memory")
    ax.legend()
    return ax


def throughput_vs_memory(frame: pd.DataFrame, ax: Axes | None = None) -> Axes:
    """Throughput against peak memory per rank, the Pareto front marked
    (:func:`metric_vs_memory` by throughput)."""
    return metric_vs_memory(frame, Metric.throughput, ax)
