"""Workload arguments and their errors, without torch: a run parses ``-a key=value`` before
it starts Ray, and importing torch then would hold Ray's start back by a second."""

from __future__ import annotations

import difflib
import importlib.machinery
import json
import os
import sys
from collections.abc import Iterable
from typing import Any

HF_PREFIX = "hf:"  # hf:<model_type>: a transformers architecture (autotune.workloads.hf)


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


def check_workload_package(spec: str, folder: str | os.PathLike[str] | None = None) -> None:
    """Raise where ``spec`` names a user workload (``package.module:function``) whose
    top-level package cannot be found, on the import path or in ``folder`` (default: the
    working directory, where the ranks look too), importing nothing: a mistyped name refused
    in a moment, before anything starts. The rest of the spec is checked as the workload is built.

    Example:
        >>> check_workload_package("gpt"), check_workload_package("json.decoder:JSONDecoder")
        (None, None)
        >>> try:
        ...     check_workload_package("no_such_package_xyz.models:build")
        ... except WorkloadError as err:
        ...     print(err)
        workload 'no_such_package_xyz.models:build': cannot import module \
'no_such_package_xyz.models' (ModuleNotFoundError: No module named 'no_such_package_xyz')
    """
    module, colon, _ = spec.partition(":")
    if not colon or spec.startswith(HF_PREFIX) or not module:
        return
    package = module.split(".")[0]
    if not package.isidentifier() or package in sys.modules:
        return  # a malformed spec is the builder's to word; an imported one is there
    where = os.fspath(folder) if folder is not None else os.getcwd()
    if importlib.machinery.PathFinder.find_spec(package, [*sys.path, where]) is None:
        raise WorkloadError(
            f"workload {spec!r}: cannot import module {module!r} (ModuleNotFoundError: No "
            f"module named {package!r})"
        )
