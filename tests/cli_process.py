"""``autotune`` as a separate process: to see what a user sees (exit code, stderr), or to kill
it mid-run and resume."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path


def run_autotune(*args: str, timeout_s: float = 120) -> subprocess.CompletedProcess[str]:
    """``python -m autotune ARGS`` to completion, its output captured."""
    return subprocess.run(
        [sys.executable, "-m", "autotune", *args],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )


def start_autotune(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "autotune", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def finished_names(results_dir: Path) -> list[str]:
    """The experiments the run's study holds as finished, in the order they finished."""
    from autotune.results import ResultsDir

    return [record["name"] for record in ResultsDir(results_dir).records()]


def wait_for_finished(results_dir: Path, count: int, timeout_s: float = 120) -> None:
    """Until the run in ``results_dir`` has committed ``count`` experiments."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if len(finished_names(results_dir)) >= count:
            return
        time.sleep(0.2)
    raise AssertionError(f"{results_dir} never held {count} finished experiments")


def wait_until(condition: Callable[[], bool], timeout_s: float = 30) -> bool:
    """Whether ``condition()`` became true within ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.2)
    return False


def processes_with_env(name: str, value: str) -> list[int]:
    """Pids of this user's processes whose environment holds ``name=value``: everything a
    process started with it set, and whatever those started in turn (Ray's workers too)."""
    wanted = f"{name}={value}".encode()
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as environ:
                if wanted in environ.read().split(b"\0"):
                    pids.append(int(entry))
        except OSError:  # gone, or not ours
            continue
    return pids


def alive(pid: int) -> bool:
    """Whether process ``pid`` still runs (a zombie, dead but not yet reaped, does not)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False
    return state != "Z"
