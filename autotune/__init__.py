"""autotune: find the fastest ZeRO data-parallel training config for a PyTorch model.

The config layer is imported eagerly (it is light); the engine and results helpers load on
first use so that ``import autotune`` and ``autotune --help`` stay fast.
"""

from __future__ import annotations

from typing import Any

from autotune.config import Config, ConfigError, load_config

__version__ = "0.1.0"

# DeepSpeed's names, so that a training script runs with ``import autotune as deepspeed``.
_LAZY = {
    "initialize": "autotune.engine",
    "add_config_arguments": "autotune.engine.launch",
    "init_distributed": "autotune.engine.launch",
    "load_results": "autotune.results",
}
_SUBMODULES = ("accelerator", "comm", "utils", "zero")  # deepspeed.accelerator, ...


def __getattr__(name: str) -> Any:
    import importlib

    if name in _SUBMODULES:
        return importlib.import_module(f"autotune.{name}")
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'autotune' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


__all__ = [
    "Config",
    "ConfigError",
    "__version__",
    "accelerator",
    "add_config_arguments",
    "comm",
    "init_distributed",
    "initialize",
    "load_config",
    "load_results",
    "utils",
    "zero",
]
