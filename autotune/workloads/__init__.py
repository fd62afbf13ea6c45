"""Workloads: built-in models with synthetic data, and user workloads ``package.module:function``.

Nothing here downloads anything. Workload arguments and their errors import without torch
(a run parses them before it starts Ray); the models load on first use.
"""

from typing import TYPE_CHECKING

from autotune.lazy import lazy_getattr
from autotune.workloads.args import WorkloadError, parse_workload_args

if TYPE_CHECKING:
    from autotune.workloads.base import MakeBatch, Workload
    from autotune.workloads.gpt import GPT, GPT_SIZES, GPTConfig, build_gpt
    from autotune.workloads.hf import build_hf, build_hf_gpt2
    from autotune.workloads.mlp import MLP, build_mlp
    from autotune.workloads.registry import (
        BUILTIN_WORKLOADS,
        check_workload,
        find_factory,
        resolve_workload,
    )

_TORCH_PARTS = {
    "MakeBatch": "autotune.workloads.base",
    "Workload": "autotune.workloads.base",
    "GPT": "autotune.workloads.gpt",
    "GPT_SIZES": "autotune.workloads.gpt",
    "GPTConfig": "autotune.workloads.gpt",
    "build_gpt": "autotune.workloads.gpt",
    "build_hf": "autotune.workloads.hf",
    "build_hf_gpt2": "autotune.workloads.hf",
    "MLP": "autotune.workloads.mlp",
    "build_mlp": "autotune.workloads.mlp",
    "BUILTIN_WORKLOADS": "autotune.workloads.registry",
    "check_workload": "autotune.workloads.registry",
    "find_factory": "autotune.workloads.registry",
    "resolve_workload": "autotune.workloads.registry",
}

__getattr__ = lazy_getattr("autotune.workloads", _TORCH_PARTS)

__all__ = [
    "BUILTIN_WORKLOADS",
    "GPT",
    "GPT_SIZES",
    "MLP",
    "GPTConfig",
    "MakeBatch",
    "Workload",
    "WorkloadError",
    "build_gpt",
    "build_hf",
    "build_hf_gpt2",
    "build_mlp",
    "check_workload",
    "find_factory",
    "parse_workload_args",
    "resolve_workload",
]
