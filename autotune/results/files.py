"""Crash-safe file writes: a reader sees the old file or the new one, never half of one."""

from __future__ import annotations

import json
import os
import uuid
from pathlib import Path
from typing import Any


def atomic_write_text(path: str | Path, text: str) -> None:
    """Write ``text`` to ``path`` via a temporary file, fsync and rename."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.parent / f".{target.name}.{uuid.uuid4().hex}.tmp"
    # os.open with 0o666 honours the umask (mkstemp would leave the file private to us).
    fd = os.open(tmp, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o666)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    _fsync_dir(target.parent)


def atomic_write_json(path: str | Path, data: Any) -> None:
    atomic_write_text(path, json.dumps(data, indent=2, sort_keys=False) + "\n")


def append_line(path: str | Path, line: str) -> None:
    """Append one line and fsync: after a crash the file ends in whole lines or a torn last one.

    A torn last line (the write was cut) is what :func:`read_jsonl` skips.
    """
    if "\n" in line:
        raise ValueError("a log line must not contain a newline")
    target = Path(path)
    with target.open("a", encoding="utf-8") as handle:
        handle.write(line + "\n")
        handle.flush()
        os.fsync(handle.fileno())


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
