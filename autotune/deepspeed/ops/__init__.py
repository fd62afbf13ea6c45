"""``deepspeed.ops``: DeepSpeed's optimizer classes, as the built-in engine runs them."""

from autotune.lazy import lazy_getattr

__getattr__ = lazy_getattr(
    "autotune.deepspeed.ops", {}, ("adagrad", "adam"), not_served="DeepSpeed"
)
