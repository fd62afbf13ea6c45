"""``deepspeed.runtime.zero``: stage 3's context managers and its parameter module."""

from autotune.deepspeed.zero import GatheredParameters, Init
from autotune.lazy import lazy_getattr

__getattr__ = lazy_getattr(
    "autotune.deepspeed.runtime.zero", {}, ("partition_parameters",), not_served="DeepSpeed"
)

__all__ = ["GatheredParameters", "Init"]
