"""What ``autotune run`` tunes when given no flags: a job that finishes in minutes on 2 cores.

The built-in gpt workload (5.8M parameters) at world size 2 over every ZeRO stage. On a
machine without a GPU the per-rank memory budget stands in for a GPU's memory, so the tuner
meets real out-of-memory boundaries: at 512 MiB per rank the largest micro-batches fit only
with the optimizer state sharded.

The one source of each default: DeepSpeed's documented ``autotuning`` defaults (profile window,
timeout, results directory, seed) are :class:`autotune.config.AutotuningConfig`'s; what is
autotune's own choice is here; an experiment's settings are derived from the job
(:func:`autotune.job.experiment_spec`), never defaulted again.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

DEFAULT_WORKLOAD = "gpt"
DEFAULT_WORLD_SIZE = 2
DEFAULT_CPUS_PER_RANK = 1
DEFAULT_CPU_DEVICE_MEMORY = "512MiB"

# The built-in config: a short profile window and timeout (instead of DeepSpeed's 3-5 and
# 600 s) keep the default run to minutes; its results go where DeepSpeed's do.
DEFAULT_CONFIG: dict[str, Any] = {
    "optimizer": {"type": "AdamW", "params": {"lr": 3e-4, "betas": [0.9, 0.95]}},
    "gradient_clipping": 1.0,
    "zero_optimization": {"stage": "all", "overlap_comm": True},
    "autotuning": {
        "enabled": True,
        "metric": "throughput",
        "tuner_type": "model_based",
        "fast": True,
        "start_profile_step": 2,
        "end_profile_step": 4,
        "max_train_micro_batch_size_per_gpu": 32,
        "num_tuning_micro_batch_sizes": 3,
        "tuner_early_stopping": 5,
        "tuner_num_trials": 30,
        "num_remeasure": 2,
        "timeout_s": 120,
    },
}


def default_results_dir() -> Path:
    """Where the built-in config's results go, and where ``report`` and ``best`` look:
    DeepSpeed's ``autotuning_results``."""
    from autotune.config import AutotuningConfig

    return Path(AutotuningConfig().results_dir)
