"""``deepspeed.checkpoint.utils``: ``clone_tensors_for_torch_save``, which Accelerate calls on
every ``get_state_dict`` (the HF ``Trainer``'s ``save_model``)."""

from typing import Any

import torch

from autotune.lazy import lazy_getattr


def clone_tensors_for_torch_save(item: Any, device: torch.device | str = "cpu") -> Any:
    """``item`` with every tensor in it (nested in dicts, lists and tuples) detached, cloned
    and moved to ``device``: a state dict that shares no storage with the live model.

    Example:
        >>> weight = torch.ones(2)
        >>> saved = clone_tensors_for_torch_save({"w": weight, "n": [weight, 3]})
        >>> saved["w"].data_ptr() != weight.data_ptr(), saved["n"][1]
        (True, 3)
    """
    if torch.is_tensor(item):
        return item.detach().clone().to(device)
    if isinstance(item, dict):
        return type(item)((k, clone_tensors_for_torch_save(v, device)) for k, v in item.items())
    if isinstance(item, list | tuple):
        return type(item)(clone_tensors_for_torch_save(v, device) for v in item)
    return item


__getattr__ = lazy_getattr(__name__, {}, not_served="DeepSpeed")

__all__ = ["clone_tensors_for_torch_save"]
