"""autotune: find the fastest ZeRO data-parallel training config for a PyTorch model.

The config layer is imported eagerly (it is light); the engine and results helpers load on
first use so that ``import autotune`` and ``autotune --help`` stay fast.
"""

from __future__ import annotations

from autotune.config import Config, ConfigError, load_config
from autotune.lazy import lazy_getattr

__version__ = "0.1.0"

# DeepSpeed's names, so that a training script runs with ``import autotune as deepspeed``.
_LAZY = {
    "initialize": "autotune.engine",
    "add_config_arguments": "autotune.engine.launch",
    "init_distributed": "autotune.engine.launch",
    "load_results": "autotune.results",
}
_SUBMODULES = ("accelerator", "comm", "utils", "zero")  # deepspeed.accelerator, ...


__getattr__ = lazy_getattr("autotune", _LAZY, _SUBMODULES)


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
