"""Experiment names: deterministic, readable, filesystem-safe, derived from the overrides.

A name identifies a configuration within one tuning run, so a resumed run recognises finished
experiments by name alone: ``z2_mbs4_rbs5e7_oc1`` is stage 2, micro-batch 4, a reduce bucket of
5e7 elements and ``overlap_comm`` on. Only knobs that differ from the user's config appear.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from autotune.config.knobs import KNOB_BY_KEY, MICRO_BATCH_KEY, STAGE_KEY, name_position

_UNSAFE = re.compile(r"[^A-Za-z0-9.-]+")


def format_value(value: Any) -> str:
    """A short, exact, filesystem-safe spelling of one value.

    Example:
        >>> [format_value(v) for v in (500_000_000, 2_500_000, 1234, True, "cpu")]
        ['5e8', '25e5', '1234', '1', 'cpu']
    """
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, int) and value >= 1000:
        mantissa, exponent = value, 0
        while mantissa % 10 == 0:
            mantissa, exponent = mantissa // 10, exponent + 1
        # "5e8" reads better than 500000000; keep the plain digits when they are short anyway.
        return f"{mantissa}e{exponent}" if exponent >= 3 else str(value)
    return _UNSAFE.sub("-", str(value)).strip("-") or "x"


def candidate_name(overrides: Mapping[str, Any], base: Mapping[str, Any]) -> str:
    """The name of the configuration ``overrides`` applied to a config whose values are ``base``.

    Stage and micro-batch always appear; any other key only when it differs from ``base``.

    Args:
        overrides: dotted keys and the values this candidate sets.
        base: the values the user's config has at those keys.

    Example:
        >>> candidate_name(
        ...     {"zero_optimization.stage": 2, "train_micro_batch_size_per_gpu": 4,
        ...      "zero_optimization.overlap_comm": True},
        ...     {"zero_optimization.overlap_comm": False})
        'z2_mbs4_oc1'
    """
    always = (STAGE_KEY, MICRO_BATCH_KEY)
    shown = [k for k, v in overrides.items() if k in always or base.get(k) != v]
    shown.sort(key=lambda k: (name_position(k), k))
    parts = [f"{_abbreviation(k)}{format_value(overrides[k])}" for k in shown]
    return "_".join(parts)


def repeat_name(name: str, index: int) -> str:
    """The name of the ``index``-th re-measurement of ``name`` (1-based).

    Example:
        >>> repeat_name("z2_mbs4", 1)
        'z2_mbs4_r1'
    """
    return f"{name}_r{index}"


def _abbreviation(key: str) -> str:
    knob = KNOB_BY_KEY.get(key)
    return knob.abbreviation if knob is not None else _UNSAFE.sub("-", key.rsplit(".", 1)[-1])
