"""Workload arguments and their errors, without torch: a run parses ``-a key=value`` before
it starts Ray, and importing torch then would hold Ray's start back by a second."""

from __future__ import annotations

import difflib
import json
from collections.abc import Iterable
from typing import Any


class WorkloadError(ValueError):
    """A workload spec or its arguments cannot give a usable workload.

    The message is one line and starts with the spec (``workload 'mypkg.models:build': ...``).
    """


def parse_workload_args(pairs: Iterable[str]) -> dict[str, Any]:
    """Parse ``key=value`` strings, reading each value as JSON where it parses.

    Args:
        pairs: Strings such as ``"n_layer=4"``, ``"dropout=0.1"``, ``'size="27m"'``, ``"name=x"``.

    Returns:
        ``{"n_layer": 4, "dropout": 0.1, "size": "27m", "name": "x"}``: JSON values where they
        parse (numbers, ``true``, ``null``, lists, objects, quoted strings), else the raw string.

    Raises:
        WorkloadError: A pair has no ``=``, its key is not an identifier, or a key repeats.
    """
    parsed: dict[str, Any] = {}
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        key = key.strip()
        if not sep or not key.isidentifier():
            raise WorkloadError(f"workload argument {pair!r}: expected key=value")
        if key in parsed:
            raise WorkloadError(f"workload argument {pair!r}: {key!r} is given twice")
        try:
            parsed[key] = json.loads(raw)
        except json.JSONDecodeError:
            parsed[key] = raw
    return parsed


def did_you_mean(name: str, known: Iterable[str]) -> str:
    """`` (did you mean 'x'?)`` naming the known name closest to a mistyped ``name``, or
    ``""`` where none is close.

    Example:
        >>> did_you_mean("gtp", ["gpt", "mlp"]), did_you_mean("resnet", ["gpt", "mlp"])
        (" (did you mean 'gpt'?)", '')
    """
    close = difflib.get_close_matches(name, list(known), n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""
