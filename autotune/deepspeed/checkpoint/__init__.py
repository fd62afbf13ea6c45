"""``deepspeed.checkpoint``: the checkpoint helpers clients call."""

from autotune.lazy import lazy_getattr

__getattr__ = lazy_getattr("autotune.deepspeed.checkpoint", {}, ("utils",), not_served="DeepSpeed")
