"""The results directory: atomic writes, the experiment log, resume, analysis.

Knows nothing about how experiments ran.
"""

from autotune.results.files import append_line, atomic_write_json, atomic_write_text, read_jsonl
from autotune.results.frame import load_results
from autotune.results.lock import DirectoryLock, ResultsLockedError
from autotune.results.plots import (
    best_so_far,
    metric_vs_memory,
    metric_vs_micro_batch,
    pareto_front,
    throughput_vs_memory,
)
from autotune.results.store import Proposal, ResultsDir, ResultsDirError

__all__ = [
    "DirectoryLock",
    "Proposal",
    "ResultsDir",
    "ResultsDirError",
    "ResultsLockedError",
    "append_line",
    "atomic_write_json",
    "atomic_write_text",
    "best_so_far",
    "load_results",
    "metric_vs_memory",
    "metric_vs_micro_batch",
    "pareto_front",
    "read_jsonl",
    "throughput_vs_memory",
]
