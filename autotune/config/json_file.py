"""Reading a config file: one JSON object, where a key written twice is an error, not a value
silently lost."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from autotune.config.errors import ConfigError
from autotune.config.keys import join_key


def read_json(path: str | Path) -> dict[str, Any]:
    """A JSON object from a file; malformed JSON, duplicate keys and a missing file are errors."""
    file = Path(path)
    if not file.exists():
        raise ConfigError("", "config file not found", str(path))
    if not file.is_file():
        raise ConfigError("", "is not a file", str(path))
    try:
        text = file.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise ConfigError("", f"cannot read: {err}", str(path)) from None
    try:
        data = json.loads(text, object_pairs_hook=_KeyCheckedObject.from_pairs)
    except json.JSONDecodeError as err:
        raise ConfigError(
            "", f"malformed JSON at line {err.lineno}, column {err.colno}: {err.msg}", str(path)
        ) from None
    if not isinstance(data, dict):
        raise ConfigError("", f"the top level must be a JSON object, got {type(data).__name__}")
    duplicate = _find_duplicate(data, "")
    if duplicate:
        raise ConfigError(duplicate, "duplicate key (JSON keeps only the last one)", str(path))
    return _plain(data)


class _KeyCheckedObject(dict[str, Any]):
    """A JSON object that remembers keys that appeared twice."""

    duplicates: list[str]

    @classmethod
    def from_pairs(cls, pairs: list[tuple[str, Any]]) -> _KeyCheckedObject:
        obj = cls()
        obj.duplicates = []
        for key, value in pairs:
            if key in obj:
                obj.duplicates.append(key)
            obj[key] = value
        return obj


def _find_duplicate(node: Any, path: str) -> str | None:
    if isinstance(node, _KeyCheckedObject) and node.duplicates:
        return join_key(path, node.duplicates[0])
    children: Iterator[tuple[str, Any]]
    if isinstance(node, dict):
        children = ((join_key(path, k), v) for k, v in node.items())
    elif isinstance(node, list):
        children = ((f"{path}[{i}]", v) for i, v in enumerate(node))
    else:
        return None
    for child_path, child in children:
        found = _find_duplicate(child, child_path)
        if found:
            return found
    return None


def _plain(node: Any) -> Any:
    if isinstance(node, dict):
        return {k: _plain(v) for k, v in node.items()}
    if isinstance(node, list):
        return [_plain(v) for v in node]
    return node
