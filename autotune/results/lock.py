"""One run per results directory: a lock file naming its owner, taken over when stale."""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path
from types import TracebackType

LOCK_NAME = ".autotune.lock"


class ResultsLockedError(RuntimeError):
    """Another live run holds the results directory."""


class DirectoryLock:
    """An exclusive lock on a results directory.

    The lock is a file created with ``O_EXCL`` holding the owner's host and pid. A lock whose
    process is gone (same host) is stale and is taken over, so ``kill -9`` never leaves a
    directory unusable.
    """

    def __init__(self, directory: str | Path) -> None:
        self.path = Path(directory) / LOCK_NAME
        self._held = False

    def acquire(self) -> None:
        owner = {"host": socket.gethostname(), "pid": os.getpid()}
        for _ in range(2):
            try:
                fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                holder = self._holder()
                if holder is not None and _alive(holder):
                    raise ResultsLockedError(
                        f"{self.path.parent} is in use by another autotune run "
                        f"(pid {holder.get('pid')} on {holder.get('host')})"
                    ) from None
                self.path.unlink(missing_ok=True)  # stale: its owner is gone
                continue
            with os.fdopen(fd, "w") as handle:
                json.dump(owner, handle)
            self._held = True
            return
        raise ResultsLockedError(f"could not take the lock {self.path}")

    def release(self) -> None:
        if self._held:
            self.path.unlink(missing_ok=True)
            self._held = False

    def _holder(self) -> dict[str, object] | None:
        try:
            data = json.loads(self.path.read_text())
        except (OSError, ValueError):
            return None
        return data if isinstance(data, dict) else None

    def __enter__(self) -> DirectoryLock:
        self.acquire()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.release()


def _alive(holder: dict[str, object]) -> bool:
    if holder.get("host") != socket.gethostname():
        return True  # cannot tell for another host: assume it is running
    pid = holder.get("pid")
    if not isinstance(pid, int):
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
