"""Search lists in a config as the user wrote it (``"zero_optimization": {"stage": [1, 2]}``):
taking them out, validated, before the rest is validated, and putting them back."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from autotune.config.errors import ConfigError, warn_once
from autotune.config.keys import get_field, nested, parent_of, spellings
from autotune.config.knobs import ALL_STAGES, KNOB_BY_KEY, SEARCHABLE_KEYS, STAGE_KEY
from autotune.config.overrides import set_key
from autotune.config.schema import DeepSpeedConfig
from autotune.config.validation import validate_section


def extract_search_space(raw: dict[str, Any]) -> dict[str, tuple[Any, ...]]:
    """Pop lists at searchable keys out of ``raw``; return them validated, without repeats."""
    space: dict[str, tuple[Any, ...]] = {}
    for dotted in SEARCHABLE_KEYS:
        parent, _ = parent_of(raw, dotted)
        spelled = [key for key in spellings(dotted) if parent is not None and key in parent]
        if len(spelled) != 1:  # unset, or set twice: validation names the clash
            continue
        key = spelled[0]
        values = parent[key]
        if dotted == STAGE_KEY and values == "all":
            values = list(ALL_STAGES)
        if not isinstance(values, list):
            continue
        if not values:
            raise ConfigError(dotted, "an empty list leaves nothing to search")
        checked: list[Any] = []
        for index, value in enumerate(values):
            try:
                value = _validate_value(dotted, value)
            except ConfigError as err:
                raise ConfigError(f"{dotted}[{index}]", err.rule) from None
            if value not in checked:
                checked.append(value)
        if not KNOB_BY_KEY[dotted].stages:
            warn_once(
                dotted,
                f"{dotted} has no effect on the built-in engine, so its list is not searched "
                f"(the first value, {checked[0]!r}, is used)",
            )
        space[dotted] = tuple(checked)
        del parent[key]
    return space


def _validate_value(dotted: str, value: Any) -> Any:
    """One value of a search list, validated as that key would be, returned normalised."""
    return get_field(validate_section(DeepSpeedConfig, nested(dotted, value), ""), dotted)


def with_search_lists(
    data: dict[str, Any], search_space: Mapping[str, tuple[Any, ...]]
) -> dict[str, Any]:
    """``data`` with each searched key holding its list of values again, as the user wrote."""
    for key, values in search_space.items():
        set_key(data, key, list(values))
    return data
