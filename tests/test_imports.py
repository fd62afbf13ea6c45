"""The layers: the pure parts import without torch, Ray or the engine, and no module of
autotune imports itself through others (the layout in docs/architecture.md)."""

from __future__ import annotations

import ast
import graphlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

import autotune

PACKAGE = Path(autotune.__file__).parent

HEAVY = ("torch", "ray", "autotune.engine")


@pytest.mark.parametrize(
    "module",
    [
        "autotune.tuner",
        "autotune.config",
        "autotune.results",
        "autotune.model_states",
        "autotune.workloads",
    ],
)
def test_pure_module_loads_neither_torch_nor_ray_nor_the_engine(module: str) -> None:
    # A fresh interpreter: this one has long since imported torch for other tests. A package
    # is in sys.modules as soon as any of its submodules is.
    probe = (
        f"import json, sys, {module}; print(json.dumps([m for m in {HEAVY!r} if m in sys.modules]))"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == [], f"import {module} loaded {done.stdout.strip()}"


# Type-only imports that close a loop, each a module that extends another's class with
# functions taking it (checkpointing is the engine's, reading a study's trials is the search
# space's, split out by size): the annotation names the class; nothing runs at import time.
TYPE_ONLY_LOOPS = {
    ("autotune.engine.checkpoint", "autotune.engine.engine"),
    ("autotune.engine.reshard", "autotune.engine.engine"),
    ("autotune.tuner.trials", "autotune.tuner.search_space"),
}


def import_graph(runtime_only: bool = False) -> dict[str, set[str]]:
    """Every module of autotune → the autotune modules it imports: every import statement,
    those inside functions too (a loop hidden there is a loop), and those under
    ``TYPE_CHECKING`` unless ``runtime_only``. ``from package import name`` counts as
    importing the submodule where ``name`` is one, else the package."""
    modules = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path

    def owner(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    def type_checking_only(tree: ast.AST) -> set[int]:
        return {
            id(node)
            for block in ast.walk(tree)
            if isinstance(block, ast.If) and ast.unparse(block.test).endswith("TYPE_CHECKING")
            for statement in block.body
            for node in ast.walk(statement)
        }

    graph: dict[str, set[str]] = {}
    for module, path in modules.items():
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        tree = ast.parse(path.read_text())
        skipped = type_checking_only(tree) if runtime_only else set()
        imported: set[str | None] = set()
        for node in ast.walk(tree):
            if id(node) in skipped:
                continue
            if isinstance(node, ast.Import):
                imported.update(owner(alias.name) for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*parent, *([base] if base else [])])
                for alias in node.names:
                    name = f"{base}.{alias.name}"
                    imported.add(name if name in modules else owner(base))
        graph[module] = {m for m in imported if m is not None and m != module}
    return graph


def test_no_module_imports_itself_through_others() -> None:
    graph = import_graph()
    assert len(graph) > 50 and "autotune.tuner.tuner" in graph["autotune.tuner"]
    runtime = import_graph(runtime_only=True)
    for module, imported in TYPE_ONLY_LOOPS:
        assert imported in graph[module] and imported not in runtime[module]
        graph[module].discard(imported)
    try:
        list(graphlib.TopologicalSorter(graph).static_order())
        cycle = None
    except graphlib.CycleError as err:
        cycle = err.args[1]
    assert cycle is None, f"import loop: {' -> '.join(cycle)}"


def test_runners_decide_nothing() -> None:
    # A runner runs what it is given: the tuner and the tuning loop are above it.
    graph = import_graph()
    runner = [m for m in graph if m.startswith("autotune.runner")]
    assert "autotune.runner.ray_runner" in runner
    above = {
        m: sorted(d for d in graph[m] if d.startswith(("autotune.tuner", "autotune.tuning")))
        for m in runner
    }
    assert {m: d for m, d in above.items() if d} == {}
