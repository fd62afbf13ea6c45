"""The results directory as a pandas DataFrame, one row per finished experiment."""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import TYPE_CHECKING, Any

from autotune.config import SEARCHABLE_KEYS
from autotune.config.keys import get_key
from autotune.experiment import ExperimentResult, Status, Timings
from autotune.metric import PEAK_MEMORY_COLUMN, Metric
from autotune.results.store import FINGERPRINT_NAME, LOG_NAME, ResultsDir, ResultsDirError
from autotune.script_target import ScriptTarget
from autotune.tuner.naming import split_repeat
from autotune.tuner.ranking import ranking

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
    and ``summary.txt`` show it: one row per configuration, repeats folded (each metric the
    median over its ok runs, ``runs`` how many, ``spread`` their spread), in the order the
    tuner declares them (:func:`autotune.tuner.ranking.ranking`), then the configurations
    that never ran ok. With ``runs=True`` as well, every experiment ranked by its own
    measurement instead.

    Columns: ``name``, ``status``, ``zero_stage``, ``micro_batch_size``,
    ``gradient_accumulation_steps``, ``train_batch_size``, one column per
    :class:`~autotune.metric.Metric` (``throughput`` samples/s, ``latency`` s/step, ``flops``
    FLOP/s per rank), ``peak_memory_bytes``, ``latency_spread`` (the window's steps),
    ``error``, ``started_at`` (UTC), ``duration_s``, ``overhead_s``, ``node_ids`` (where each
    rank ran: with ``started_at`` and ``duration_s``, which experiments overlapped where),
    ``repeat_of``, ``target`` (what ran: the workload, e.g. ``gpt``, or the script, e.g.
    ``train.py``), ``oversubscription`` (how far other processes oversubscribed the ranks'
    cores during the window, 0 for none), plus every tuned knob flattened under its dotted key
    (``zero_optimization.reduce_bucket_size``, ...); ranked by configuration, also ``runs``
    (the measurements it ranks on: the undisturbed ones where it has any), ``spread`` (over
    those, of the ranked metric) and ``disturbed_runs``.

    Raises:
        ResultsDirError: ``path`` is not a results directory.

    Example:
        >>> df = load_results("results/example_run")  # the default run this repository holds
        >>> best = df[df.status == "ok"].sort_values("throughput", ascending=False).iloc[0]
        >>> int(best["zero_stage"]) in range(4), bool(best["throughput"] > 0)
        (True, True)
        >>> ranked = load_results("results/example_run", ranked_by="throughput")
        >>> ranked.iloc[0]["name"] == json.load(open("results/example_run/summary.json"))[
        ...     "best"]["name"]
        True
    """
    import pandas as pd

    directory = Path(path)
    if not (directory / LOG_NAME).exists():
        raise ResultsDirError(f"{directory} is not an autotune results directory (no {LOG_NAME})")
    job_target = _job_target(directory)
    results = ResultsDir(directory)
    if ranked_by is None:
        rows = [_row(record, job_target) for record in results.records()]
    elif runs:
        rows = [_row(record, job_target) for record in results.ranked_runs(Metric(ranked_by))]
    else:
        rows = _configuration_rows(results.records(), Metric(ranked_by), job_target)
    frame = pd.DataFrame(rows, columns=_columns(rows))
    if not frame.empty:
        frame["started_at"] = pd.to_datetime(frame["started_at"], utc=True, errors="coerce")
    return frame


def _configuration_rows(
    records: list[dict[str, Any]], metric: Metric, job_target: str | None
) -> list[dict[str, Any]]:
    """One row per configuration in the run's ranking, then those that never ran ok: the
    original's record, its metrics folded over its ok runs (medians; peak memory the
    largest, as the ranking counts it)."""
    by_name = {record["name"]: record for record in records}
    ok_runs: dict[str, list[dict[str, Any]]] = {}
    for record in records:
        if record.get("status") == Status.ok.value and record.get("metrics"):
            ok_runs.setdefault(split_repeat(record["name"])[0], []).append(record["metrics"])
    rows = []
    for ranked in ranking((ExperimentResult.from_dict(r) for r in records), metric):
        row = _row(by_name[ranked.name], job_target)
        row["name"], row["status"] = ranked.name, Status.ok.value
        for each in Metric:
            row[each.value] = statistics.median(each.of(m) for m in ok_runs[ranked.name])
        row[PEAK_MEMORY_COLUMN] = ranked.peak_memory_bytes
        rows.append(
            {
                **row,
                "runs": ranked.num_measurements,
                "spread": ranked.spread,
                "disturbed_runs": ranked.num_disturbed,
            }
        )
    for name, record in by_name.items():
        if split_repeat(name)[1] == 0 and name not in ok_runs:
            rows.append(
                {**_row(record, job_target), "runs": 0, "spread": None, "disturbed_runs": 0}
            )
    return rows


def _job_target(directory: Path) -> str | None:
    """What the directory's job ran, from its fingerprint: for log lines written before each
    line named its target."""
    try:
        tuned = json.loads((directory / FINGERPRINT_NAME).read_text(encoding="utf-8"))["tuned"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    script = tuned.get("script")
    if isinstance(script, dict) and "script" in script:
        return ScriptTarget(path=str(script["script"]), module=script.get("module")).label
    workload = tuned.get("workload")
    return str(workload) if workload is not None else None


def _row(record: dict[str, Any], job_target: str | None = None) -> dict[str, Any]:
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
        "error": record.get("error"),
        "started_at": record.get("started_at"),
        "duration_s": timings.get("total_s"),
        "overhead_s": Timings(**timings).overhead_s if "total_s" in timings else None,
        "node_ids": tuple(record.get("node_ids") or ()),
        "repeat_of": record.get("repeat_of"),
        "target": record.get("target", job_target),
        "engine": record.get("engine", "builtin"),  # logs before the choice: builtin
    }
    for key in (*SEARCHABLE_KEYS, *EXTRA_KNOBS):
        if "." in key:
            row[key] = get_key(config, key)
    return row


def _columns(rows: list[dict[str, Any]]) -> list[str]:
    if rows:
        return list(rows[0])
    return list(_row({"name": "", "status": ""}))
