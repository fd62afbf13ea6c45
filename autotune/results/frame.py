"""The results directory as a pandas DataFrame, one row per finished experiment."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from autotune.config import SEARCHABLE_KEYS
from autotune.config.keys import get_key
from autotune.experiment import Timings
from autotune.metric import PEAK_MEMORY_COLUMN, Metric
from autotune.results.store import FINGERPRINT_NAME, LOG_NAME, ResultsDir, ResultsDirError
from autotune.script import ScriptTarget

if TYPE_CHECKING:
    import pandas as pd

# Knobs flattened into columns besides the searchable keys.
EXTRA_KNOBS = ("zero_optimization.offload_optimizer.device", "bf16.enabled", "fp16.enabled")
# Every rankable metric (its name is its column), then what is shown beside it.
METRIC_COLUMNS = (*(metric.value for metric in Metric), PEAK_MEMORY_COLUMN, "latency_spread")


def load_results(path: str | Path, ranked_by: Metric | str | None = None) -> pd.DataFrame:
    """Load a results directory into a DataFrame: one row per experiment, in the order they
    finished, or with ``ranked_by`` a metric, best first (see :meth:`ResultsDir.ranked`).

    Columns: ``name``, ``status``, ``zero_stage``, ``micro_batch_size``,
    ``gradient_accumulation_steps``, ``train_batch_size``, one column per
    :class:`~autotune.metric.Metric` (``throughput`` samples/s, ``latency`` s/step, ``flops``
    FLOP/s per rank), ``peak_memory_bytes``, ``latency_spread``,
    ``error``, ``started_at`` (UTC), ``duration_s``, ``overhead_s``, ``node_ids`` (where each
    rank ran: with ``started_at`` and ``duration_s``, which experiments overlapped where),
    ``repeat_of``, ``target`` (what ran: the workload, e.g. ``gpt``, or the script, e.g.
    ``train.py``), plus every tuned knob flattened under its dotted key
    (``zero_optimization.reduce_bucket_size``, ...).

    Raises:
        ResultsDirError: ``path`` is not a results directory.

    Example:
        >>> df = load_results("results/example_run")  # the default run this repository holds
        >>> best = df[df.status == "ok"].sort_values("throughput", ascending=False).iloc[0]
        >>> int(best["zero_stage"]) in range(4), bool(best["throughput"] > 0)
        (True, True)
    """
    import pandas as pd

    directory = Path(path)
    if not (directory / LOG_NAME).exists():
        raise ResultsDirError(f"{directory} is not an autotune results directory (no {LOG_NAME})")
    job_target = _job_target(directory)
    results = ResultsDir(directory)
    records = results.records() if ranked_by is None else results.ranked(Metric(ranked_by))
    rows = [_row(record, job_target) for record in records]
    frame = pd.DataFrame(rows, columns=_columns(rows))
    if not frame.empty:
        frame["started_at"] = pd.to_datetime(frame["started_at"], utc=True, errors="coerce")
    return frame


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
    }
    for key in (*SEARCHABLE_KEYS, *EXTRA_KNOBS):
        if "." in key:
            row[key] = get_key(config, key)
    return row


def _columns(rows: list[dict[str, Any]]) -> list[str]:
    if rows:
        return list(rows[0])
    return list(_row({"name": "", "status": ""}))
