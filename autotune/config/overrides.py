"""Changing a config as the user wrote it: set a dotted key, lay one config over another,
apply a candidate's values.

These work on raw dicts (DeepSpeed's JSON shape), before validation; the loader validates what
they make.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from autotune.config.fields import AUTO
from autotune.config.keys import parent_of, spellings
from autotune.config.schema import TRIAD


def set_key(spec: dict[str, Any], dotted: str, value: Any) -> None:
    """Set ``a.b.c`` in a raw config dict, dropping other spellings of the same key.

    Example:
        >>> spec = {"zero_optimization": {"max_live_parameters": 5}}
        >>> set_key(spec, "zero_optimization.stage3_max_live_parameters", 7); spec
        {'zero_optimization': {'stage3_max_live_parameters': 7}}
    """
    parent, key = parent_of(spec, dotted, create=True)
    for alias in spellings(dotted):
        parent.pop(alias, None)
    parent[key] = value


def overridden(spec: Mapping[str, Any], overrides: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of ``spec`` with the dotted keys of ``overrides`` set, everything else kept.

    Two triad members determine the third: the overridden ones are kept, then a global batch
    the user fixed, then the user's accumulation; the rest is left to be derived again.
    So a new micro-batch keeps a fixed ``train_batch_size`` (accumulation follows) and
    otherwise keeps the user's accumulation (the global batch follows).

    Example:
        >>> overridden({"train_batch_size": 32, "train_micro_batch_size_per_gpu": 8},
        ...            {"train_micro_batch_size_per_gpu": 4})
        {'train_batch_size': 32, 'train_micro_batch_size_per_gpu': 4}
    """
    result = copy.deepcopy(dict(spec))
    kept = [key for key in TRIAD if key in overrides]
    if kept:
        for anchor in ("train_batch_size", "gradient_accumulation_steps"):
            if len(kept) < 2 and anchor in result and anchor not in kept:
                kept.append(anchor)
        for key in TRIAD:
            if key not in kept:
                result.pop(key, None)
    for key, value in overrides.items():
        set_key(result, key, value)
    return result


def overlay(base: Mapping[str, Any], top: Mapping[str, Any]) -> dict[str, Any]:
    """``top`` laid over ``base``: sections merge key by key, ``top`` winning, except where
    ``top`` says ``"auto"`` and ``base`` has a value (a client such as the HF Trainer filled
    it in).

    The batch triad is one setting: when ``top`` changes any of it, ``base``'s are dropped, so
    the two never combine into three sizes that disagree.

    Example:
        >>> overlay({"fp16": {"enabled": True}, "zero_optimization": {"stage": 0, "x": 1}},
        ...         {"zero_optimization": {"stage": 2}})
        {'fp16': {'enabled': True}, 'zero_optimization': {'stage': 2, 'x': 1}}
        >>> filled_by_client = {"optimizer": {"params": {"lr": 3e-5}}}
        >>> overlay(filled_by_client, {"optimizer": {"params": {"lr": "auto"}}})
        {'optimizer': {'params': {'lr': 3e-05}}}
    """
    changed = any(key in top and top[key] != AUTO and top[key] != base.get(key) for key in TRIAD)
    drop = TRIAD if changed else ()
    merged = {key: value for key, value in base.items() if key not in drop}
    for key, value in top.items():
        below = merged.get(key)
        if isinstance(value, Mapping) and isinstance(below, Mapping):
            merged[key] = overlay(below, value)
        elif not (value == AUTO and key in merged):
            merged[key] = value
    return merged


def as_client_reads(
    spec: Mapping[str, Any], overrides: Mapping[str, Any], resolved: Mapping[str, Any]
) -> dict[str, Any]:
    """The config file a client reads for a candidate: the user's config as written, with
    the candidate's values set and ``autotuning`` removed, ``"auto"`` kept where the user
    wrote it (the HF Trainer and Accelerate fill those in from their own arguments), and a
    batch size the user wrote as a number set to what the candidate's batch makes of it.

    Args:
        spec: the config as the user wrote it.
        overrides: the candidate's dotted-key values.
        resolved: the candidate's config with the batch triad resolved.

    Example:
        >>> spec = {"train_micro_batch_size_per_gpu": "auto", "train_batch_size": "auto",
        ...         "optimizer": {"params": {"lr": "auto"}}, "autotuning": {"fast": True}}
        >>> as_client_reads(spec, {"train_micro_batch_size_per_gpu": 4,
        ...                        "zero_optimization.stage": 2},
        ...                 {"train_micro_batch_size_per_gpu": 4, "train_batch_size": 8})
        ... # doctest: +NORMALIZE_WHITESPACE
        {'train_batch_size': 'auto', 'optimizer': {'params': {'lr': 'auto'}},
         'train_micro_batch_size_per_gpu': 4, 'zero_optimization': {'stage': 2}}
    """
    result = copy.deepcopy({k: v for k, v in spec.items() if k != "autotuning"})
    for key in TRIAD:
        if key in result and result[key] != AUTO and key in resolved:
            result[key] = resolved[key]
    for key, value in overrides.items():
        set_key(result, key, value)
    return result
