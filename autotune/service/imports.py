"""Where a module a job names will really be imported from, found as the job's processes find
it and without importing anything: a ``-m MODULE`` script and a ``package.module:function``
workload may run code from the allowed roots only.

A name is not enough. A folder ``os/`` in a root does not make ``import os`` load it (the
standard library's ``os`` is loaded long before), and a folder ``torch/`` does not make
``torch.hub`` the root's (the job's processes have imported the installed ``torch``). So a
module is allowed only where

- its top-level name is neither Python's own (built in, frozen, the standard library) nor
  found anywhere outside the roots (an installed package, an editable install, a folder on
  the job's import path): a job's processes import many installed packages before the job's
  own code, and which of two same-named modules an import then loads is not the root's to
  say;
- every file the import runs (each package's ``__init__.py``, the module itself) lies inside a
  root, links resolved.

The service asks in a fresh interpreter with the job's environment and working directory
(:func:`import_problem_for_job`), so that the import path, the ``.pth`` files and the finders
of editable installs are the job's; the job's process asks again in itself before it imports
(:func:`import_problem`).
"""

from __future__ import annotations

import importlib.machinery
import json
import os
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import ModuleType

PYTHON_ITSELF = "Python's own (built in or its standard library)"
_ASK_TIMEOUT_S = 60.0


def import_problem(module: str, path: Sequence[str], roots: Sequence[Path]) -> str | None:
    """Why importing ``module`` in this process, with ``path`` as its import path, would run
    code from outside ``roots`` (one line); None where it would not.

    Example:
        >>> import_problem("os", [], [Path("/srv/code")])
        "module 'os' is Python's own (built in or its standard library), not the allowed roots'"
    """
    top = module.partition(".")[0]
    if _is_python_itself(top):
        return f"module {top!r} is {PYTHON_ITSELF}, not the allowed roots'"
    outside = [entry for entry in path if not is_inside(entry, roots)]
    elsewhere = _origin(sys.modules.get(top)) or _found(top, outside)
    if elsewhere is not None and not all(is_inside(place, roots) for place in elsewhere):
        return (
            f"module {top!r} is also {_place(elsewhere)}, outside the allowed roots, and a "
            "job's processes import that one"
        )
    try:
        files = module_files(module, path)
    except ModuleNotFoundError as err:
        return f"module {module!r} is not found in the allowed roots ({err})"
    for file in files:
        if not is_inside(file, roots):
            return f"module {module!r} loads {file}, outside the allowed roots"
    return None


def module_files(module: str, path: Sequence[str]) -> list[str]:
    """The files (a namespace package: its folders) that ``import module`` runs in this
    process with ``path`` as its import path, each package's first: found by the finders the
    import system asks, in its order, and by what this process has already imported.

    Raises:
        ModuleNotFoundError: a part of the name is found nowhere.
    """
    files: list[str] = []
    search: Sequence[str] | None = list(path)
    parts = module.split(".")
    for depth in range(1, len(parts) + 1):
        name = ".".join(parts[:depth])
        loaded = sys.modules.get(name)
        if loaded is not None:
            places = _origin(loaded)
            locations = getattr(loaded, "__path__", None)
        else:
            spec = _find_spec(name, search, top_level=depth == 1)
            if spec is None:
                raise ModuleNotFoundError(f"no module named {name!r}")
            places = _spec_places(spec)
            locations = spec.submodule_search_locations
        files += places or [f"<{name}: no file>"]
        if depth < len(parts):
            if locations is None:
                raise ModuleNotFoundError(f"{name!r} is not a package")
            search = list(locations)
    return files


def import_problem_for_job(
    module: str,
    *,
    cwd: Path,
    roots: Sequence[Path],
    environment: Mapping[str, str],
    first: bool,
) -> str | None:
    """:func:`import_problem` asked of a fresh interpreter with the job's ``environment``, in
    ``cwd``: a ``-m`` script's folder comes first on its import path (``first``), a
    workload's root last (as :func:`autotune.workloads.registry.find_factory` appends it).
    Nothing is imported there but this module; a site's ``.pth`` files run, as in a job."""
    code = "import sys; from autotune.service.imports import _answer; _answer(sys.argv[1:])"
    request = json.dumps({"module": module, "cwd": str(cwd), "first": first})
    command = [sys.executable, "-P", "-c", code, request, *(str(root) for root in roots)]
    try:
        answer = subprocess.run(
            command,
            cwd=cwd,
            env=dict(environment),
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=_ASK_TIMEOUT_S,
            check=True,
        )
        problem: str | None = json.loads(answer.stdout.strip().splitlines()[-1])["problem"]
    except (OSError, subprocess.SubprocessError, ValueError, IndexError, KeyError) as err:
        stderr = getattr(err, "stderr", None) or ""
        said = stderr.strip().splitlines()[-1] if stderr.strip() else str(err)
        return f"module {module!r}: where it resolves could not be found out ({said})"
    return problem


def _answer(argv: list[str]) -> None:
    """The fresh interpreter's side of :func:`import_problem_for_job`."""
    request = json.loads(argv[0])
    roots = [Path(root) for root in argv[1:]]
    here = [request["cwd"]]
    path = here + sys.path if request["first"] else sys.path + here
    print(json.dumps({"problem": import_problem(request["module"], path, roots)}))


def is_inside(place: str | Path, roots: Sequence[Path]) -> bool:
    """Whether ``place`` (links resolved) is one of ``roots`` or lies inside one (a
    ``<built-in>`` place is not)."""
    if str(place).startswith("<"):
        return False
    resolved = Path(os.path.realpath(place))
    for root in roots:
        real = Path(os.path.realpath(root))
        if resolved == real or real in resolved.parents:
            return True
    return False


def _is_python_itself(name: str) -> bool:
    return (
        name in sys.builtin_module_names
        or name in sys.stdlib_module_names
        or importlib.machinery.FrozenImporter.find_spec(name) is not None
    )


def _find_spec(
    name: str, search: Sequence[str] | None, top_level: bool
) -> importlib.machinery.ModuleSpec | None:
    """The spec the import system's finders give ``name``, in their order; the path finder
    searches ``search`` (a top-level name: the job's import path, not this process's)."""
    for finder in sys.meta_path:
        if finder is importlib.machinery.PathFinder:
            spec = importlib.machinery.PathFinder.find_spec(name, search)
        elif top_level and finder in (
            importlib.machinery.BuiltinImporter,
            importlib.machinery.FrozenImporter,
        ):
            continue  # Python's own: refused before this is asked
        else:
            find = getattr(finder, "find_spec", None)
            spec = find(name, None if top_level else search) if find is not None else None
        if spec is not None:
            return spec
    return None


def _found(name: str, path: Sequence[str]) -> list[str] | None:
    """Where a top-level ``name`` is found on ``path`` or by an installed finder (an
    editable install's), or None."""
    spec = _find_spec(name, path, top_level=True)
    return _spec_places(spec) if spec is not None else None


def _spec_places(spec: importlib.machinery.ModuleSpec) -> list[str]:
    if spec.origin and spec.origin not in ("built-in", "frozen") and spec.has_location:
        return [spec.origin]
    if spec.origin in ("built-in", "frozen"):
        return [f"<{spec.origin}>"]
    return list(spec.submodule_search_locations or [])


def _origin(module: ModuleType | None) -> list[str] | None:
    if module is None:
        return None
    file = getattr(module, "__file__", None)
    if file:
        return [file]
    return list(getattr(module, "__path__", None) or ["<built-in>"])


def _place(places: list[str]) -> str:
    where = places[0]
    return f"installed at {where}" if not where.startswith("<") else where.strip("<>")
