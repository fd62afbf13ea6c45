"""Dotted config keys (``zero_optimization.stage``): the one walk along them.

The same path is followed through raw JSON dicts, validated config objects and the schema's
model classes; only the step from a node to its child differs, so it is passed in.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Final


class _Missing:
    """The marker for "no such key" (``None`` is a value a config may hold)."""

    def __repr__(self) -> str:
        return "MISSING"


MISSING: Final = _Missing()

Step = Callable[[Any, str], Any]


def item(node: Any, name: str) -> Any:
    """``node[name]`` of a mapping; MISSING when absent or when ``node`` is not a mapping."""
    return node.get(name, MISSING) if isinstance(node, Mapping) else MISSING


def attribute(node: Any, name: str) -> Any:
    """``node.name``; MISSING when absent."""
    return getattr(node, name, MISSING)


def new_section(node: Any, name: str) -> Any:
    """``node[name]``, made an empty dict first unless it is one (for writing below it)."""
    child = node.get(name)
    if not isinstance(child, dict):
        child = node[name] = {}
    return child


def walk(root: Any, path: str, step: Step = item) -> Any:
    """The node at dotted ``path`` below ``root`` (``""`` is ``root``); MISSING if a step is.

    Example:
        >>> walk({"zero_optimization": {"stage": 2}}, "zero_optimization.stage")
        2
        >>> walk({"zero_optimization": 2}, "zero_optimization.stage")
        MISSING
    """
    node = root
    for name in path.split(".") if path else ():
        node = step(node, name)
        if node is MISSING:
            break
    return node


def get_key(tree: Mapping[str, Any], dotted: str, default: Any = None) -> Any:
    """The value at ``dotted`` in a nested dict, ``default`` where the path does not exist."""
    found = walk(tree, dotted)
    return default if found is MISSING else found


def get_field(obj: Any, dotted: str) -> Any:
    """The attribute at ``dotted`` of a validated config (``config.zero_optimization.stage``).

    Raises:
        AttributeError: naming the path, when the config has no such field.
    """
    found = walk(obj, dotted, attribute)
    if found is MISSING:
        raise AttributeError(f"{type(obj).__name__} has no field {dotted!r}")
    return found


def parent_of(tree: dict[str, Any], dotted: str, create: bool = False) -> tuple[Any, str]:
    """The dict that holds ``dotted``'s last key, and that key.

    The parent is None where the path does not exist, unless ``create`` makes the sections
    on the way (replacing any non-dict value there).

    Example:
        >>> tree = {}
        >>> parent, key = parent_of(tree, "zero_optimization.stage", create=True)
        >>> parent[key] = 3; tree
        {'zero_optimization': {'stage': 3}}
    """
    path, _, key = dotted.rpartition(".")
    parent = walk(tree, path, new_section if create else item)
    return (parent if isinstance(parent, dict) else None), key


def nested(dotted: str, value: Any) -> dict[str, Any]:
    """``{"a": {"b": value}}`` for ``"a.b"``."""
    tree: dict[str, Any] = {}
    parent, key = parent_of(tree, dotted, create=True)
    parent[key] = value
    return tree
