"""One run per results directory: an advisory lock the kernel drops when its owner dies."""

from __future__ import annotations

import fcntl
import json
import os
import socket
from pathlib import Path

LOCK_NAME = ".autotune.lock"


class ResultsLockedError(RuntimeError):
    """Another live run holds the results directory."""


class DirectoryLock:
    """An exclusive lock on a results directory.

    ``flock`` on a lock file: the kernel releases it when the owning process exits in any way
    (``kill -9`` included), so a dead run never leaves a directory unusable and there is no
    stale-lock race between two runs taking over. The file names the owner for the error
    message only; it is never removed, so a waiting run cannot lock a file that is gone.
    """

    def __init__(self, directory: str | Path) -> None:
        self.path = Path(directory) / LOCK_NAME
        self._fd: int | None = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def acquire(self) -> None:
        fd = os.open(self.path, os.O_CREAT | os.O_RDWR, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            holder = self._holder()
            raise ResultsLockedError(
                f"{self.path.parent} is in use by another autotune run "
                f"(pid {holder.get('pid', '?')} on {holder.get('host', '?')})"
            ) from None
        owner = json.dumps({"host": socket.gethostname(), "pid": os.getpid()}).encode()
        os.ftruncate(fd, 0)
        os.pwrite(fd, owner, 0)
        self._fd = fd

    def release(self) -> None:
        if self._fd is not None:
            os.ftruncate(self._fd, 0)
            os.close(self._fd)  # closing drops the flock
            self._fd = None

    def _holder(self) -> dict[str, object]:
        try:
            data = json.loads(self.path.read_text() or "{}")
        except (OSError, ValueError):
            return {}
        return data if isinstance(data, dict) else {}

    def __enter__(self) -> DirectoryLock:
        self.acquire()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.release()
