"""autotune: find the fastest ZeRO data-parallel training config for a PyTorch model.

The config layer is imported eagerly (it is light); the engine and results helpers load on
first use so that ``import autotune`` and ``autotune --help`` stay fast.
"""

from __future__ import annotations

from typing import Any

from autotune.config import Config, ConfigError, load_config
from autotune.lazy import lazy_getattr

__version__ = "0.1.0"

# DeepSpeed's names, so that a training script runs with ``import autotune as deepspeed``: what
# autotune.deepspeed serves (``initialize``, ``comm``, ``zero``, ``runtime``, ...), and
# load_results.
_LAZY = {"load_results": "autotune.results"}
_getattr = lazy_getattr("autotune", _LAZY)


def __getattr__(name: str) -> Any:
    import autotune.deepspeed as served

    if name in served.__all__ or name in served.SERVED_MODULES:
        return getattr(served, name)
    return _getattr(name)


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
