"""``deepspeed.zero``'s context managers for stage-3 scripts: ``Init`` and ``GatheredParameters``.

Example:
    >>> import torch
    >>> import autotune as deepspeed
    >>> from autotune.workloads import build_mlp
    >>> with deepspeed.zero.Init():
    ...     model = build_mlp(d_in=8, d_hidden=16).model  # whole; initialize() partitions it
    >>> ds_config = {"train_micro_batch_size_per_gpu": 2, "zero_optimization": {"stage": 3}}
    >>> engine, *_ = deepspeed.initialize(model=model, config=ds_config)
    >>> head = model.net[-1].weight
    >>> with deepspeed.zero.GatheredParameters(head, modifier_rank=0):
    ...     if deepspeed.comm.get_rank() == 0:
    ...         _ = torch.nn.init.zeros_(head)  # kept, and re-partitioned on exit
    >>> with deepspeed.zero.GatheredParameters(head):
    ...     head.detach().abs().sum().item()
    0.0
"""

from __future__ import annotations

from collections.abc import Iterable
from contextlib import ExitStack
from typing import Any

import torch

from autotune.lazy import lazy_getattr


class Init:
    """Build a model for stage 3 inside this block, as DeepSpeed's ``zero.Init``.

    The engine partitions parameters when ``initialize`` wraps the model, so here the model is
    built whole on every rank (DeepSpeed partitions each module as it is made, which bounds
    the peak while building a model too large for one device). Every argument DeepSpeed takes
    is accepted and changes nothing.
    """

    def __init__(self, module: torch.nn.Module | None = None, **kwargs: Any) -> None:
        del module, kwargs

    def __enter__(self) -> Init:
        return self

    def __exit__(self, *exc_info: object) -> None:
        return None


class GatheredParameters:
    """Full parameters inside the block, at every stage.

    Args:
        params: a parameter or an iterable of them (of a model an engine trains; others are
            left alone, as they are whole anyway).
        modifier_rank: the rank whose changes to ``params`` are kept: on exit its values are
            broadcast and written into every rank's shard and fp32 master copy. None: the
            block only reads them (changes are discarded at stage 3).
        fwd_module: accepted for compatibility (DeepSpeed registers external parameters).
        enabled: False makes the block do nothing.
    """

    def __init__(
        self,
        params: torch.nn.Parameter | Iterable[torch.nn.Parameter],
        modifier_rank: int | None = None,
        fwd_module: torch.nn.Module | None = None,
        enabled: bool = True,
    ) -> None:
        del fwd_module
        # One tensor or several; a tensor no engine trains (a buffer, a new embedding made
        # outside it) is whole already and is left alone, as DeepSpeed does.
        self.params: list[torch.Tensor] = (
            [params] if isinstance(params, torch.Tensor) else list(params)
        )
        self.modifier_rank = modifier_rank
        self.enabled = enabled
        self._stack = ExitStack()

    def __enter__(self) -> GatheredParameters:
        if not self.enabled:
            return self
        from autotune.engine.engine import engines_owning

        for engine, params in engines_owning(self.params):
            self._stack.enter_context(engine.gathered_parameters(params, self.modifier_rank))
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self._stack.__exit__(*exc_info)  # the block's exception reaches the engine's context


__getattr__ = lazy_getattr(__name__, {}, not_served="DeepSpeed")

__all__ = ["GatheredParameters", "Init"]
