"""autotune: find the fastest ZeRO data-parallel training config for a PyTorch model.

The config layer is imported eagerly (it is light); the engine and results helpers load on
first use so that ``import autotune`` and ``autotune --help`` stay fast.
"""

from __future__ import annotations

from typing import Any

from autotune.config import Config, ConfigError, load_config

__version__ = "0.1.0"

_LAZY = {
    "initialize": "autotune.engine",
    "load_results": "autotune.results",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'autotune' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)


__all__ = ["Config", "ConfigError", "__version__", "initialize", "load_config", "load_results"]
