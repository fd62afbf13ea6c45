"""What ``autotune run`` tunes when given no flags: a job that finishes in minutes on 2 cores.

The built-in gpt workload (5.8M parameters) at world size 2 over every ZeRO stage. On a
machine without a GPU the per-rank memory budget stands in for a GPU's memory, so the tuner
meets real out-of-memory boundaries: at 512 MiB per rank the largest micro-batches fit only
with the optimizer state sharded.
"""

from __future__ import annotations

from typing import Any

DEFAULT_WORKLOAD = "gpt"
DEFAULT_WORLD_SIZE = 2
DEFAULT_CPU_DEVICE_MEMORY = "512MiB"

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
        "results_dir": "autotune_results",
    },
}
