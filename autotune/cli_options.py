"""A command's flags made from an options model (:mod:`autotune.run_options`): each option's
spellings, help, type and range are its field's, declared once, so that ``run`` and
``submit`` take the same flags a service job and :func:`autotune.api.tune` take.
"""

from __future__ import annotations

import enum
import functools
import inspect
import operator
import types
from collections.abc import Callable, Collection
from typing import Annotated, Any, TypeVar, get_args, get_origin

import annotated_types
import typer
from pydantic import BaseModel, ValidationError

from autotune.run_options import option_flags, option_info

Command = TypeVar("Command", bound=Callable[..., Any])


def with_options(
    model: type[BaseModel],
    fail: Callable[[str], typer.Exit],
    exclude: Collection[str] = (),
    overrides: dict[str, Any] | None = None,
) -> Callable[[Command], Command]:
    """Give a command the flags of ``model``'s fields (but ``exclude``'s); the command takes
    them as one argument, ``options``, a ``model`` (a value it rejects: one line, exit 2, by
    ``fail``). ``overrides``: a field's flag default the command line has of its own."""

    def decorate(command: Command) -> Command:
        own = inspect.signature(command, eval_str=True)
        flags = _parameters(model, exclude, overrides or {})

        @functools.wraps(command)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            given = {p.name: kwargs.pop(p.name) for p in flags}
            values = {k: v for k, v in given.items() if v is not None}
            try:
                options = model(**values)
            except ValidationError as err:
                raise fail(_one_line(model, err, given)) from None
            return command(*args, options=options, **kwargs)

        parameters = [p for p in own.parameters.values() if p.name != "options"]
        wrapper.__signature__ = own.replace(parameters=[*parameters, *flags])  # type: ignore[attr-defined]
        wrapper.__annotations__ = {}  # the signature's, resolved, are what Typer reads
        return wrapper  # type: ignore[return-value]

    return decorate


def _parameters(
    model: type[BaseModel], exclude: Collection[str], overrides: dict[str, Any]
) -> list[inspect.Parameter]:
    """``model``'s fields as Typer options."""
    parameters = []
    for name, field in model.model_fields.items():
        if name in exclude:
            continue
        kind: Any = option_info(field).cli or _plain_type(field.annotation)
        settings: dict[str, Any] = {
            "help": field.description,
            "show_default": field.default is not None and _plain(field.default),
        }
        for rule in field.metadata:
            if isinstance(rule, annotated_types.Ge):
                settings["min"] = rule.ge
            elif isinstance(rule, annotated_types.Le):
                settings["max"] = rule.le
        if any(isinstance(t, type) and issubclass(t, enum.Enum) for t in get_args(kind)):
            settings["case_sensitive"] = False
        default = overrides.get(name, field.default if _plain(field.default) else None)
        annotation = Annotated[kind, typer.Option(*option_flags(model, name), **settings)]
        parameters.append(
            inspect.Parameter(
                name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=annotation
            )
        )
    return parameters


def _plain_type(annotation: Any) -> Any:
    """``annotation`` as Typer reads it: a union's members without pydantic's rules."""
    members = get_args(annotation) if isinstance(annotation, types.UnionType) else ()
    if not members:
        return annotation
    plain = [get_args(m)[0] if get_origin(m) is Annotated else m for m in members]
    return functools.reduce(operator.or_, plain)


def _plain(default: Any) -> bool:
    """A default the command line shows as it is (not a mutable one: a list or a dict)."""
    return not isinstance(default, list | dict)


def _one_line(model: type[BaseModel], err: ValidationError, given: dict[str, Any]) -> str:
    """The first thing wrong, as ``--flag value: what is wrong``."""
    first = err.errors()[0]
    name = str(first["loc"][0]) if first["loc"] else ""
    message = str(first["msg"]).removeprefix("Value error, ")
    message = message[:1].lower() + message[1:]
    if name not in model.model_fields:
        return message
    flag = option_flags(model, name)[0].split("/")[0]
    value = given.get(name)
    shown = " ".join(map(str, value)) if isinstance(value, list) else value
    return f"{flag} {shown}: {message}"
