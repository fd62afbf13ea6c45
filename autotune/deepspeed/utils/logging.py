"""``deepspeed.utils.logging``: DeepSpeed's ``logger`` and ``log_dist`` (DeepSpeedExamples'
HelloDeepSpeed logs through them; clients set the logger's level).

Example:
    >>> from autotune.deepspeed.utils.logging import log_dist
    >>> log_dist("Creating Model", ranks=[0])   # by rank 0 only; before a process group, by all
    [...] [INFO] [Rank -1] Creating Model
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Sequence

from autotune.deepspeed import comm
from autotune.lazy import lazy_getattr


class _CurrentStdout(logging.StreamHandler):
    """Writes to whatever ``sys.stdout`` is now (script mode and tests redirect it)."""

    @property
    def stream(self) -> object:
        return sys.stdout

    @stream.setter
    def stream(self, _value: object) -> None:
        pass


def _make_logger() -> logging.Logger:
    log = logging.getLogger(__name__)
    if not log.handlers:
        handler = _CurrentStdout()
        handler.setFormatter(
            logging.Formatter("[%(asctime)s] [%(levelname)s] %(message)s", "%Y-%m-%d %H:%M:%S")
        )
        log.addHandler(handler)
        log.setLevel(logging.INFO)
        log.propagate = False  # printed once, as DeepSpeed's logger does
    return log


logger = _make_logger()


def log_dist(message: str, ranks: Sequence[int] | None = None, level: int = logging.INFO) -> None:
    """Log ``message`` on the ranks listed (``[-1]``: every rank; none: every rank before
    the process group exists, else none), prefixed with the rank, as DeepSpeed does."""
    initialized = comm.is_initialized()
    rank = comm.get_rank() if initialized else -1
    wanted = list(ranks or [])
    if not initialized or (wanted and wanted[0] == -1) or rank in wanted:
        logger.log(level, f"[Rank {rank}] {message}")


__getattr__ = lazy_getattr(__name__, {}, not_served="DeepSpeed")

__all__ = ["log_dist", "logger"]
