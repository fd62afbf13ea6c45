"""A fresh process (a Ray worker, a torchrun rank) imports the autotune its driver runs, even
from a folder holding a directory named autotune (a clone, seen from the folder above it)."""

from __future__ import annotations

import importlib.machinery
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import autotune
from autotune.runner.ray_gang import DriverPaths

# The folder autotune is imported from; a copy installed in the interpreter has none to find.
_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(autotune.__file__)))
_INSTALLED = _ROOT.startswith((sys.prefix, sys.base_prefix))
pytestmark = pytest.mark.skipif(_INSTALLED, reason="autotune is installed in the interpreter")

# The command line as an editable install (``pip install -e``, what install.sh does) runs it:
# no working directory on the path (a console script's first entry is its bin/ folder), and
# autotune found by a finder that Python asks only after every folder on the path, never
# through a folder on it.
_EDITABLE_DRIVER = """
import importlib.machinery, importlib.util, os, sys
root = sys.argv.pop(1)
sys.path[:] = [p for p in sys.path[1:] if p and os.path.abspath(p) != root]

class Editable:
    @staticmethod
    def find_spec(name, path=None, target=None):
        if name != "autotune":
            return None
        package = os.path.join(root, "autotune")
        init = os.path.join(package, "__init__.py")
        return importlib.util.spec_from_file_location(
            name, init, submodule_search_locations=[package]
        )

sys.meta_path.insert(sys.meta_path.index(importlib.machinery.PathFinder) + 1, Editable)
sys.argv[0] = "autotune"
from autotune.cli import main
main()
"""


def _clone_holder(tmp_path: Path) -> Path:
    """A folder holding what a clone of autotune looks like from outside: a directory named
    autotune without ``__init__.py``, whose ``results/`` is not autotune's package."""
    (tmp_path / "autotune" / "results" / "gpu").mkdir(parents=True)
    (tmp_path / "autotune" / "README.md").write_text("a clone\n")
    return tmp_path


def _editable_autotune(cwd: Path, *args: str, timeout_s: float) -> subprocess.CompletedProcess[str]:
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    return subprocess.run(
        [sys.executable, "-c", _EDITABLE_DRIVER, _ROOT, *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )


def test_the_workers_paths_find_the_drivers_autotune_past_a_clone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(_clone_holder(tmp_path))
    # The driver's own path, as under an editable install: autotune's folder is not on it.
    monkeypatch.setattr(sys, "path", [p for p in sys.path if os.path.abspath(p or ".") != _ROOT])
    paths = list(DriverPaths.capture().sys_path)
    assert paths[0] == str(tmp_path)  # the working directory is still first, for workloads
    spec = importlib.machinery.PathFinder.find_spec("autotune", paths)
    assert spec is not None and spec.origin == autotune.__file__


@pytest.mark.slow
def test_a_run_started_in_the_folder_holding_a_clone_runs(tmp_path: Path) -> None:
    cwd = _clone_holder(tmp_path)
    # One experiment on one Ray worker, two steps: what the worker imports is the point.
    args = ["run", "--workload", "mlp", "--num-trials", "1", "--world-size", "1"]
    args += ["--start-profile-step", "1", "--end-profile-step", "2", "--results-dir", "r", "-q"]
    done = _editable_autotune(cwd, *args, "--runner", "ray", timeout_s=300)
    assert done.returncode == 0, done.stdout + done.stderr
    metrics = json.loads(next((cwd / "r" / "exps").glob("*/metrics.json")).read_text())
    assert metrics["status"] == "ok", metrics


@pytest.mark.slow
def test_exec_started_in_the_folder_holding_a_clone_runs(tmp_path: Path) -> None:
    cwd = _clone_holder(tmp_path)
    (cwd / "train.py").write_text("import deepspeed\nprint('served by', deepspeed.__name__)\n")
    done = _editable_autotune(cwd, "exec", "--nproc", "1", "--", "train.py", timeout_s=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "served by autotune.deepspeed" in done.stdout


def test_python_started_in_the_folder_holding_a_clone_imports_the_installed_autotune(
    tmp_path: Path,
) -> None:
    # A notebook or script beside the clone, as docs/results.md's snippets run: the working
    # directory first on the path, and the install as install.sh makes it (pyproject's
    # package-dir puts the clone itself on the path, where a package beats the namespace).
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    code = "from autotune.results import ResultsDir\nimport autotune\nprint(autotune.__file__)"
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=_clone_holder(tmp_path),
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == autotune.__file__
