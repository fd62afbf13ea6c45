"""``deepspeed.runtime``: the engine, its LR schedules and stage 3's parameter module."""

from autotune.lazy import lazy_getattr

__getattr__ = lazy_getattr(
    "autotune.deepspeed.runtime", {}, ("engine", "lr_schedules", "zero"), not_served="DeepSpeed"
)
