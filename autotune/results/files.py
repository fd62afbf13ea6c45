"""Crash-safe file writes: a reader sees the old file or the new one, never half of one."""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, BinaryIO


@contextmanager
def atomic_writer(path: str | Path) -> Iterator[BinaryIO]:
    """A binary handle whose contents replace ``path`` only once the block finishes.

    Written to a temporary file in the same folder, fsynced, renamed over ``path`` and the
    folder fsynced; an exception (or a kill) leaves ``path`` as it was.
    """
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.parent / f".{target.name}.{uuid.uuid4().hex}.tmp"
    # os.open with 0o666 honours the umask (mkstemp would leave the file private to us).
    fd = os.open(tmp, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o666)
    try:
        with os.fdopen(fd, "wb") as handle:
            yield handle
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    _fsync_dir(target.parent)


def atomic_write_text(path: str | Path, text: str) -> None:
    """Write ``text`` to ``path`` via a temporary file, fsync and rename."""
    with atomic_writer(path) as handle:
        handle.write(text.encode("utf-8"))


def atomic_write_json(path: str | Path, data: Any) -> None:
    atomic_write_text(path, json.dumps(data, indent=2, sort_keys=False) + "\n")


def append_line(path: str | Path, line: str) -> None:
    """Append one line and fsync: after a crash the file ends in whole lines or a torn last one.

    :func:`read_jsonl` skips a torn last line, and the next append cuts it off first.
    """
    if "\n" in line:
        raise ValueError("a log line must not contain a newline")
    target = Path(path)
    with target.open("a+b") as handle:
        _drop_torn_tail(handle)
        handle.write(line.encode("utf-8") + b"\n")
        handle.flush()
        os.fsync(handle.fileno())


def _drop_torn_tail(handle: BinaryIO) -> None:
    """Cut a line left unfinished by a crash, so the next record starts a line of its own.

    The torn line was never committed (its experiment is re-run on resume), so nothing that
    counted is lost.
    """
    size = handle.seek(0, os.SEEK_END)
    if size == 0:
        return
    handle.seek(max(0, size - 65536))
    tail = handle.read()
    if tail.endswith(b"\n"):
        return
    cut = tail.rfind(b"\n")
    keep = size - len(tail) + cut + 1 if cut >= 0 else 0
    if cut < 0 and size > len(tail):
        raise ValueError(f"{handle.name}: the last line is longer than 64 KiB and unfinished")
    handle.truncate(keep)
    handle.seek(keep)


def read_jsonl(path: str | Path) -> list[dict[str, Any]]:
    """Every whole JSON line of ``path``; a torn final line is ignored.

    Raises:
        ValueError: a line other than the last is not valid JSON (the file was edited or
            corrupted, not merely cut short).
    """
    target = Path(path)
    if not target.exists():
        return []
    lines = target.read_text(encoding="utf-8").split("\n")
    records: list[dict[str, Any]] = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            if number == len(lines):  # no newline after it: the write was cut short
                continue
            raise ValueError(f"{target}:{number}: not a JSON line") from None
    return records


def _fsync_dir(directory: Path) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
