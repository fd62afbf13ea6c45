"""``deepspeed.runtime.engine``: ``DeepSpeedEngine`` is the built-in ZeRO engine's class, so a
client's ``isinstance(model, DeepSpeedEngine)`` (Accelerate's ``unwrap_model``) recognises it."""

from autotune.engine.engine import ZeroEngine as DeepSpeedEngine
from autotune.lazy import lazy_getattr

__getattr__ = lazy_getattr(__name__, {}, not_served="DeepSpeed")

__all__ = ["DeepSpeedEngine"]
