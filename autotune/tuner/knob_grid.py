"""The knobs tuned at each ZeRO stage, and the values tried: the defaults (``fast: false``;
:data:`autotune.config.knobs.KNOBS`), sizes that follow the model's size, the user's lists in
their place, and the point established practice recommends."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from autotune.config import Config
from autotune.config.keys import get_field
from autotune.config.knobs import CHECKPOINTING_KEY, KNOB_BY_KEY, KNOBS, OFFLOAD_KEY, name_position


def default_knobs(stage: int, num_params: int | None) -> dict[str, tuple[Any, ...]]:
    """The knobs tuned by default at ``stage`` (``fast: false``) and the values tried.

    Example:
        >>> default_knobs(1, num_params=10_000_000)["zero_optimization.reduce_bucket_size"]
        (500000, 2000000, 10000000)
    """
    return {
        knob.key: size_grid(num_params, knob.default_grid)
        if knob.scales_with_model
        else knob.default_grid
        for knob in KNOBS
        if stage in knob.default_stages
    }


def size_grid(num_params: int | None, reference: tuple[int, ...]) -> tuple[int, ...]:
    """Element counts to try for a bucket-like knob on a model of ``num_params`` parameters.

    Sizes at or above the model's size behave alike, so they collapse into one (the model's
    size rounded up to 1, 2 or 5 × 10^k) and quarters below it keep the grid as long.

    Example:
        >>> size_grid(10**10, (5 * 10**7, 10**9)), size_grid(3 * 10**6, (5 * 10**7, 10**9))
        ((50000000, 1000000000), (1000000, 5000000))
    """
    if num_params is None or max(reference) < num_params:
        return reference
    whole = _nice(num_params, up=True)
    values = {v for v in reference if v < whole} | {whole}
    while len(values) < len(reference):
        smaller = _nice(max(1, min(values) // 4), up=False)
        if smaller in values:
            break
        values.add(smaller)
    return tuple(sorted(values))


def _nice(value: int, up: bool) -> int:
    """The nearest of 1, 2, 5 × 10^k above (``up``) or below ``value``."""
    ladder = sorted(m * 10**k for k in range(len(str(value)) + 1) for m in (1, 2, 5))
    if up:
        return next(v for v in ladder if v >= value)
    return max(v for v in ladder if v <= value)


def knob_dims(
    config: Config, stage: int, num_params: int | None
) -> tuple[tuple[str, tuple[Any, ...]], ...]:
    """Knobs tuned at ``stage``: the defaults (unless fast), replaced by the user's lists."""
    dims = {} if config.autotuning.fast else default_knobs(stage, num_params)
    current = current_values(config)
    for key, values in dims.items():
        dims[key] = prefer_current(values, current[key], num_params)
    for key, values in config.search_space.items():
        knob = KNOB_BY_KEY[key]
        if knob.per_stage and stage in knob.stages:
            dims[key] = values
    return tuple(sorted(dims.items(), key=lambda item: name_position(item[0])))


def recommended_point(
    dims: tuple[tuple[str, tuple[Any, ...]], ...], current: Mapping[str, Any]
) -> tuple[tuple[str, Any], ...] | None:
    """The knob values established practice sets (:attr:`Knob.recommended`), the config's own
    elsewhere; None where no recommendation applies (that point is the config's own, run in
    the micro-batch phase already) or a value is not among those searched.

    Example:
        >>> dims = (("zero_optimization.reduce_bucket_size", (10, 100)),
        ...         ("zero_optimization.overlap_comm", (False, True)))
        >>> recommended_point(dims, {"zero_optimization.reduce_bucket_size": 100,
        ...                          "zero_optimization.overlap_comm": False})
        (('zero_optimization.reduce_bucket_size', 100), ('zero_optimization.overlap_comm', True))
    """
    point = []
    for key, values in dims:
        recommended = KNOB_BY_KEY[key].recommended
        value = recommended if recommended is not None else current.get(key)
        if value not in values:
            return None
        point.append((key, value))
    return tuple(point) if any(v != current.get(k) for k, v in point) else None


def prefer_current(
    values: tuple[Any, ...], current: Any, num_params: int | None
) -> tuple[Any, ...]:
    """``values`` with the config's own size standing in for the one it behaves like.

    A size at or above the model's behaves as the grid's largest does; using the config's
    spelling keeps that point's name equal to the micro-batch phase's, so it is not run twice.
    """
    if num_params is None or not isinstance(current, int) or isinstance(current, bool):
        return values
    if current < num_params or values[-1] < num_params:
        return values
    return (*values[:-1], current)


def current_values(config: Config) -> dict[str, Any]:
    """The config's value at every key a candidate may set."""
    values: dict[str, Any] = {
        OFFLOAD_KEY: config.zero_optimization.optimizer_offload_device.value,
        CHECKPOINTING_KEY: config.activation_checkpointing.enabled,
    }
    for knob in KNOBS:
        if knob.per_stage:
            values[knob.key] = get_field(config, knob.key)
    return values
