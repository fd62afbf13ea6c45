"""Scripts under ``experiments/`` imported as modules, so tests can call their pure parts."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

EXPERIMENTS = Path(__file__).resolve().parents[1] / "experiments"


def load_script(stem: str) -> ModuleType:
    """``experiments/<stem>.py`` as a module (registered under ``stem``: dataclasses look
    their module up by name)."""
    spec = importlib.util.spec_from_file_location(stem, EXPERIMENTS / f"{stem}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module
