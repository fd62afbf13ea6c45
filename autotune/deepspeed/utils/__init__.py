"""``deepspeed.utils``: the logging helpers training scripts call (``logger``, ``log_dist``),
which live in ``deepspeed.utils.logging`` as in DeepSpeed (Lightning sets the level of
``deepspeed.utils.logging.logger``; transformers imports ``deepspeed.utils.logger``)."""

from autotune.deepspeed.utils import logging
from autotune.deepspeed.utils.logging import log_dist, logger
from autotune.lazy import lazy_getattr

__getattr__ = lazy_getattr(__name__, {}, not_served="DeepSpeed")

__all__ = ["log_dist", "logger", "logging"]
