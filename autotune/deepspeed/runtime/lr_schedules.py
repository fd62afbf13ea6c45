"""``deepspeed.runtime.lr_schedules``: DeepSpeed's schedules, as the config's ``scheduler``
section builds them, and the list of their names clients check a scheduler's type against
(Accelerate hands a scheduler to ``initialize`` only if its class is one of them)."""

from autotune.engine.schedulers import (
    SCHEDULERS,
    LRRangeTest,
    OneCycle,
    WarmupCosineLR,
    WarmupDecayLR,
    WarmupLR,
)
from autotune.lazy import lazy_getattr

VALID_LR_SCHEDULES = list(SCHEDULERS)

__getattr__ = lazy_getattr(__name__, {}, not_served="DeepSpeed")

__all__ = [
    "VALID_LR_SCHEDULES",
    "LRRangeTest",
    "OneCycle",
    "WarmupCosineLR",
    "WarmupDecayLR",
    "WarmupLR",
]
