"""Workloads: built-in models with synthetic data, and user workloads ``package.module:function``.

Nothing here downloads anything.
"""

from autotune.workloads.base import MakeBatch, Workload, WorkloadError
from autotune.workloads.gpt import GPT, GPT_SIZES, GPTConfig, build_gpt
from autotune.workloads.hf import build_hf, build_hf_gpt2
from autotune.workloads.mlp import MLP, build_mlp
from autotune.workloads.registry import (
    BUILTIN_WORKLOADS,
    check_workload,
    find_factory,
    parse_workload_args,
    resolve_workload,
)

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
