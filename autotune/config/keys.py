"""Dotted config keys (``zero_optimization.stage``): the one walk along them, and looking keys
up in the schema (the field a key sets, the keys a section accepts, a key's spellings).

The same path is followed through raw JSON dicts, validated config objects and the schema's
model classes; only the step from a node to its child differs, so it is passed in.
"""

from __future__ import annotations

import functools
import types
import typing
from collections.abc import Callable, Mapping
from typing import Any, Final

from pydantic import AliasChoices, BaseModel
from pydantic.fields import FieldInfo

from autotune.config.schema import DeepSpeedConfig


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


def join_key(prefix: str, key: str) -> str:
    """``key`` below dotted ``prefix`` (``""`` is the top level)."""
    return f"{prefix}.{key}" if prefix else key


def nested(dotted: str, value: Any) -> dict[str, Any]:
    """``{"a": {"b": value}}`` for ``"a.b"``."""
    tree: dict[str, Any] = {}
    parent, key = parent_of(tree, dotted, create=True)
    parent[key] = value
    return tree


# --- looking keys up in the schema -------------------------------------------------------------


def model_field(model: type[BaseModel], key: str) -> FieldInfo | None:
    """The field of ``model`` that ``key`` (its name or an alias) sets."""
    for name, field in model.model_fields.items():
        aliases = field.validation_alias
        if key == name or (isinstance(aliases, AliasChoices) and key in aliases.choices):
            return field
    return None


def submodel(annotation: Any) -> type[BaseModel] | None:
    """The BaseModel inside ``X``, ``X | None`` or ``Annotated[X, ...]``."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType, typing.Annotated):
        for arg in typing.get_args(annotation):
            found = submodel(arg)
            if found is not None:
                return found
    return None


def _section_model(model: Any, key: str) -> Any:
    """The model of section ``key`` below ``model`` (a step of :func:`walk`)."""
    field = model_field(model, key)
    found = submodel(field.annotation) if field is not None else None
    return MISSING if found is None else found


@functools.cache  # the schema never changes, and every load asks for the top-level keys
def known_keys(model: type[BaseModel], path: str = "") -> tuple[str, ...]:
    """Field names and aliases accepted at dotted ``path`` below ``model``."""
    section = walk(model, path, _section_model)
    if section is MISSING:
        return ()
    names: list[str] = []
    for name, field in section.model_fields.items():
        names.append(name)
        if isinstance(field.validation_alias, AliasChoices):
            names.extend(str(a) for a in field.validation_alias.choices)
    return tuple(names)


@functools.cache  # every load asks for every searchable key
def spellings(dotted: str, model: type[BaseModel] = DeepSpeedConfig) -> tuple[str, ...]:
    """All spellings of the last key of ``dotted`` (its name first).

    Example:
        >>> spellings("zero_optimization.stage3_max_live_parameters")
        ('stage3_max_live_parameters', 'max_live_parameters')
    """
    path, _, last = dotted.rpartition(".")
    section = walk(model, path, _section_model)
    field = model_field(section, last) if section is not MISSING else None
    if field is not None and isinstance(field.validation_alias, AliasChoices):
        return tuple(str(a) for a in field.validation_alias.choices)
    return (last,)
