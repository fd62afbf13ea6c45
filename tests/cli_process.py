"""``autotune`` as a separate process, for tests that kill it mid-run and resume."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path


def start_autotune(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "autotune", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def wait_for_lines(log: Path, count: int, timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if log.exists() and len(log.read_text().splitlines()) >= count:
            return
        time.sleep(0.2)
    raise AssertionError(f"{log} never reached {count} lines")
