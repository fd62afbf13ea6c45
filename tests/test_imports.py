"""The pure parts import without torch, Ray or the engine (the README's layout: the layers)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

HEAVY = ("torch", "ray", "autotune.engine")


@pytest.mark.parametrize(
    "module", ["autotune.tuner", "autotune.config", "autotune.results", "autotune.model_states"]
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
