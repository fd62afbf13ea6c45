"""The results directory as a pandas DataFrame, one row per finished experiment."""

from __future__ import annotations

import statistics
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from autotune.config import SEARCHABLE_KEYS
from autotune.config.keys import get_key
from autotune.experiment import ExperimentResult, Status, Timings
from autotune.metric import PEAK_MEMORY_COLUMN, Metric
from autotune.profiling.interference import is_disturbed
from autotune.results.store import Proposal, ResultsDir, ResultsDirError
from autotune.tuner.ranking import Ranked, rank

if TYPE_CHECKING:
    import pandas as pd

# Knobs flattened into columns besides the searchable keys.
EXTRA_KNOBS = ("zero_optimization.offload_optimizer.device", "bf16.enabled", "fp16.enabled")
# Every rankable metric (its name is its column), then what is shown beside it.
METRIC_COLUMNS = (
    *(metric.value for metric in Metric),
    PEAK_MEMORY_COLUMN,
    "latency_spread",
    "oversubscription",
)


def load_results(
    path: str | Path, ranked_by: Metric | str | None = None, runs: bool = False
) -> pd.DataFrame:
    """Load a results directory into a DataFrame.

    Without ``ranked_by``: one row per experiment (re-measurements included), in the order
    they finished. With ``ranked_by`` a metric: the run's one ranking, as ``autotune report``
    and ``summary.txt`` show it: one row per configuration, repeats folded over the runs the
    ranking counts (its undisturbed ones where it has any: the ranked metric is the ranking's
    own value, every other metric the median over the same runs, ``runs`` how many,
    ``spread`` their spread; see :func:`fold_runs`), in the order the tuner declares them
    (:func:`autotune.tuner.ranking.rank`), then the configurations that never ran ok. With
    ``runs=True`` as well, every experiment ranked by its own measurement instead.

    Columns: ``name``, ``status``, ``zero_stage``, ``micro_batch_size``,
    ``gradient_accumulation_steps``, ``train_batch_size``, one column per
    :class:`~autotune.metric.Metric` (``throughput`` samples/s, ``latency`` s/step, ``flops``
    FLOP/s per rank), ``peak_memory_bytes``, ``latency_spread`` (the window's steps),
    ``error``, ``started_at`` (UTC), ``duration_s``, ``overhead_s``, ``node_ids`` (where each
    rank ran: with ``started_at`` and ``duration_s``, which experiments overlapped where),
    ``repeat_of``, ``target`` (what ran: the workload, e.g. ``gpt``, or the script, e.g.
    ``train.py``), ``oversubscription`` (how far other processes oversubscribed the ranks'
    cores during the window, 0 for none), ``disturbed`` (measured while they did; by
    configuration: ranked on such measurements alone, having no other), plus every tuned knob
    flattened under its dotted key (``zero_optimization.reduce_bucket_size``, ...); ranked by
    configuration, also ``runs`` (the measurements it ranks on: the undisturbed ones where it
    has any), ``spread`` (over those, of the ranked metric; None for one measurement) and
    ``disturbed_runs``.

    Raises:
        ResultsDirError: ``path`` is not a results directory.

    Example:
        >>> df = load_results("results/example_run")  # the default run this repository holds
        >>> best = df[df.status == "ok"].sort_values("throughput", ascending=False).iloc[0]
        >>> int(best["zero_stage"]) in range(4), bool(best["throughput"] > 0)
        (True, True)
        >>> import json
        >>> ranked = load_results("results/example_run", ranked_by="throughput")
        >>> ranked.iloc[0]["name"] == json.load(open("results/example_run/summary.json"))[
        ...     "best"]["name"]
        True
    """
    import pandas as pd

    directory = Path(path)
    results = ResultsDir(directory)
    if not results.is_results_dir():
        raise ResultsDirError(f"{directory} is not an autotune results directory (no run there)")
    if ranked_by is None:
        rows = [_row(record) for record in results.records()]
    elif runs:
        rows = [_row(record) for record in results.ranked_runs(Metric(ranked_by))]
    else:
        rows = _configuration_rows(results.records(), Metric(ranked_by))
    frame = pd.DataFrame(rows, columns=_columns(rows))
    if not frame.empty:
        frame["started_at"] = pd.to_datetime(frame["started_at"], utc=True, errors="coerce")
    return frame


def _configuration_rows(records: list[dict[str, Any]], metric: Metric) -> list[dict[str, Any]]:
    """One row per configuration in the run's ranking, then those that never ran ok: the
    original's record, its metrics folded over the runs the ranking counts (see
    :func:`fold_runs`)."""
    by_name = {record["name"]: record for record in records}
    repeat_of = {record["name"]: record.get("repeat_of") for record in records}
    rows = []
    for ranked in rank((ExperimentResult.from_dict(r) for r in records), metric, repeat_of):
        row = _row(by_name.get(ranked.name) or by_name[ranked.runs[0]])
        row["name"], row["status"] = ranked.name, Status.ok.value
        row.update(fold_runs(ranked, metric, {run: by_name[run]["metrics"] for run in ranked.runs}))
        rows.append(
            {
                **row,
                "runs": ranked.num_measurements,
                # Measured once, it has none: 0% would read as perfectly steady.
                "spread": ranked.spread if ranked.num_measurements > 1 else None,
                "disturbed_runs": ranked.num_disturbed,
            }
        )
    ranked_names = {row["name"] for row in rows}
    for name, record in by_name.items():
        if record.get("repeat_of") is None and name not in ranked_names:
            rows.append({**_row(record), "runs": 0, "spread": None, "disturbed_runs": 0})
    return rows


def fold_runs(
    ranked: Ranked, metric: Metric, measured: Mapping[str, Mapping[str, Any]]
) -> dict[str, Any]:
    """A configuration's columns over the runs its ranking counts (``ranked.runs``: the
    undisturbed ones where it has any), so that a table shows for it what the ranking,
    ``summary.txt`` and ``best`` decided on: ``metric`` is the ranking's own value, every other
    metric (and ``latency_spread``, ``oversubscription``) the median over those runs, peak
    memory the largest of all its runs, as the ranking counts it. ``measured``: each run's
    metrics by its name (a log record's ``metrics``, or a row of :func:`load_results`).

    Example:
        >>> from autotune.tuner.ranking import Measurement, rank_measurements
        >>> runs = {"a": {"throughput": 10.0, "latency": 0.8}, "a_r1": {"throughput": 4.0,
        ...         "latency": 2.0}, "a_r2": {"throughput": 12.0, "latency": 0.67}}
        >>> ranked = rank_measurements([Measurement("a", 10.0, 0, run="a"),
        ...     Measurement("a", 4.0, 0, disturbed=True, run="a_r1"),
        ...     Measurement("a", 12.0, 0, run="a_r2")], Metric.throughput)[0]
        >>> folded = fold_runs(ranked, Metric.throughput, runs)
        >>> folded["throughput"], round(folded["latency"], 3), folded["disturbed"]
        (11.0, 0.735, False)
    """
    folded: dict[str, Any] = {}
    for column in METRIC_COLUMNS:
        values = [
            float(m[column]) for m in (measured[run] for run in ranked.runs) if _number(m, column)
        ]
        folded[column] = statistics.median(values) if values else None
    folded[metric.value] = ranked.value
    folded[PEAK_MEMORY_COLUMN] = ranked.peak_memory_bytes
    folded["disturbed"] = ranked.disturbed
    return folded


def _number(measured: Mapping[str, Any], column: str) -> bool:
    value = measured.get(column)
    return value is not None and value == value  # NaN: a frame's missing value


def _row(record: dict[str, Any]) -> dict[str, Any]:
    config = record.get("ds_config") or {}
    metrics = record.get("metrics") or {}
    timings = record.get("timings") or {}
    zero = config.get("zero_optimization") or {}
    row: dict[str, Any] = {
        "name": record["name"],
        "status": record["status"],
        "zero_stage": zero.get("stage", 0),
        "micro_batch_size": config.get("train_micro_batch_size_per_gpu"),
        "gradient_accumulation_steps": config.get("gradient_accumulation_steps"),
        "train_batch_size": config.get("train_batch_size"),
        **{column: metrics.get(column) for column in METRIC_COLUMNS},
        "disturbed": is_disturbed(metrics.get("oversubscription")),
        "error": record.get("error"),
        "started_at": record.get("started_at"),
        "duration_s": timings.get("total_s"),
        "overhead_s": Timings(**timings).overhead_s if "total_s" in timings else None,
        "node_ids": tuple(record.get("node_ids") or ()),
        "repeat_of": proposal.repeat_of if (proposal := Proposal.of(record)) else None,
        "target": record.get("target"),
        "engine": record.get("engine"),
    }
    for key in (*SEARCHABLE_KEYS, *EXTRA_KNOBS):
        if "." in key:
            row[key] = get_key(config, key)
    return row


def _columns(rows: list[dict[str, Any]]) -> list[str]:
    if rows:
        return list(rows[0])
    return list(_row({"name": "", "status": ""}))
