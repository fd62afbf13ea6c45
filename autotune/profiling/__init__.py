"""Measuring experiments: FLOPs, activation memory, model info, and step-time statistics.

Pure measurement: nothing here writes files. The step statistics are importable without
torch (experiment records use them); the torch-based parts load on first use.
"""

from autotune.lazy import lazy_getattr
from autotune.profiling.window import StepTimer, WindowStats, window_stats

_TORCH_PARTS = {
    "count_train_flops": "autotune.profiling.flops",
    "flops_per_micro_batch": "autotune.profiling.flops",
    "ModelInfo": "autotune.profiling.model_info",
    "model_info": "autotune.profiling.model_info",
    "saved_activation_bytes": "autotune.profiling.model_info",
}


__getattr__ = lazy_getattr("autotune.profiling", _TORCH_PARTS)


__all__ = [
    "ModelInfo",
    "StepTimer",
    "WindowStats",
    "count_train_flops",
    "flops_per_micro_batch",
    "model_info",
    "saved_activation_bytes",
    "window_stats",
]
