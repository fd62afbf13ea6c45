"""Plots of a results DataFrame (from :func:`load_results`) for notebooks and reports."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from autotune.metric import PEAK_MEMORY_COLUMN, PEAK_MEMORY_LABEL, Metric
from autotune.tuner.ranking import Measurement, declared_order, rank_measurements

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


def _ok(frame: pd.DataFrame) -> pd.DataFrame:
    """One row per configuration that ran ok: repeats folded into the median of each metric."""
    ok = frame[frame["status"] == "ok"]
    if "repeat_of" not in ok.columns:
        return ok
    config = ok["repeat_of"].fillna(ok["name"])
    # Medians of the speed metrics; the largest peak memory, as the ranking reports it.
    folded = ok.groupby(config).agg(
        {m.value: "median" for m in Metric} | {PEAK_MEMORY_COLUMN: "max"}
    )
    originals = ok[ok["name"].isin(folded.index)].set_index("name")
    originals[list(folded.columns)] = folded.loc[originals.index]
    return originals.reset_index()


def metric_vs_micro_batch(
    frame: pd.DataFrame, metric: Metric | str = Metric.throughput, ax: Axes | None = None
) -> Axes:
    """One line per ZeRO stage: the metric against the micro-batch size (best knobs each)."""
    metric = Metric(metric)
    ax = _axes(ax)
    ok = _ok(frame)
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
    for name, repeat_of, value, peak, is_ok in zip(
        frame["name"],
        frame.get("repeat_of", frame["name"]),
        frame[metric.value],
        frame[PEAK_MEMORY_COLUMN],
        ok,
        strict=True,
    ):
        if is_ok:
            config = repeat_of if isinstance(repeat_of, str) else name
            measured.append(Measurement(config, float(value), int(peak)))
        best = declared_order(rank_measurements(measured, metric))
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


def pareto_front(frame: pd.DataFrame) -> pd.DataFrame:
    """The ok experiments no other beats on both throughput (higher) and memory (lower)."""
    throughput = Metric.throughput.value
    ok = _ok(frame).sort_values([PEAK_MEMORY_COLUMN, throughput], ascending=[True, False])
    front: list[Any] = []
    best = float("-inf")
    for index, row in ok.iterrows():
        if row[throughput] > best:
            front.append(index)
            best = row[throughput]
    return ok.loc[front]


def throughput_vs_memory(frame: pd.DataFrame, ax: Axes | None = None) -> Axes:
    """Throughput against peak memory per rank, the Pareto front marked."""
    ax = _axes(ax)
    ok = _ok(frame)
    throughput = Metric.throughput
    for stage, group in ok.groupby("zero_stage"):
        ax.scatter(group[PEAK_MEMORY_COLUMN] / GIB, group[throughput.value], label=f"ZeRO {stage}")
    front = pareto_front(frame)
    ax.plot(
        front[PEAK_MEMORY_COLUMN] / GIB,
        front[throughput.value],
        color="black",
        linestyle="--",
        marker="*",
        markersize=10,
        label="Pareto front",
    )
    ax.set_xlabel(MEMORY_AXIS_LABEL)
    ax.set_ylabel(throughput.label)
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
    ax.set_title("throughput vs memory")
    ax.legend()
    return ax
