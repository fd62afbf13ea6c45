"""``deepspeed.runtime.zero.partition_parameters``: where DeepSpeed's ``zero.Init`` and
``ZeroParamStatus`` live.

``ZeroParamStatus`` is the ``ds_status`` of a parameter at stage 3 (the engine's own enum, with
DeepSpeed's names and values): AVAILABLE while it is whole (inside ``GatheredParameters``, while
its module runs, or when the engine does not train it), NOT_AVAILABLE while partitioned.
TRL reads it to decide whether to gather its LM head.

transformers wraps ``zero_wrapper_for_fp_tensor_constructor`` around model construction at
stage 3 (so that ``torch.arange`` keeps its dtype) and restores it after. The built-in
engine's ``Init`` builds the model whole and never calls it, so the wrap changes nothing; the
names are here so that it finds them.
"""

from collections.abc import Callable
from typing import Any

import torch

from autotune.deepspeed.accelerator import get_accelerator
from autotune.deepspeed.zero import GatheredParameters, Init
from autotune.engine.stage3 import ZeroParamStatus
from autotune.lazy import lazy_getattr

_orig_torch_arange = torch.arange


def zero_wrapper_for_fp_tensor_constructor(
    fn: Callable[..., torch.Tensor], target_fp_dtype: torch.dtype, target_device: Any = None
) -> Callable[..., torch.Tensor]:
    """``fn`` making floating-point tensors of ``target_fp_dtype`` on ``target_device``, as
    DeepSpeed's ``Init`` wraps tensor constructors."""

    def wrapped(*args: Any, **kwargs: Any) -> torch.Tensor:
        if target_device is not None and "device" not in kwargs:
            kwargs["device"] = target_device
        tensor = fn(*args, **kwargs)
        return tensor.to(target_fp_dtype) if tensor.is_floating_point() else tensor

    return wrapped


__getattr__ = lazy_getattr(__name__, {}, not_served="DeepSpeed")

__all__ = [
    "GatheredParameters",
    "Init",
    "ZeroParamStatus",
    "get_accelerator",
    "zero_wrapper_for_fp_tensor_constructor",
]
