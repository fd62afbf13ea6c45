"""Measuring experiments: FLOPs, activation memory, model info, and step-time statistics.

Pure measurement: nothing here writes files.
"""

from autotune.profiling.flops import count_train_flops, flops_per_micro_batch
from autotune.profiling.model_info import ModelInfo, model_info, saved_activation_bytes
from autotune.profiling.window import StepTimer, WindowStats, window_stats

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
