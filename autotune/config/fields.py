"""The field types config sections are built from: JSON values read as DeepSpeed reads them.

Integers may be written as integral floats (``5e8``), booleans are never numbers, and
``"auto"`` is accepted exactly where DeepSpeed's documentation allows it. A section is a
pydantic model that rejects unknown keys (:class:`Section`) or, for a library's own options,
passes them through (:class:`OpenSection`).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict

AUTO = "auto"


def _as_int(value: Any, minimum: int | None) -> int:
    """JSON numbers as integers: ``5e8`` is fine when integral, ``True`` and ``2.5`` are not."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"expected an integer, got {value!r}")
    if isinstance(value, float):
        if not value.is_integer():
            raise ValueError(f"expected an integer, got {value!r}")
        value = int(value)
    if minimum is not None and value < minimum:
        raise ValueError(f"must be >= {minimum}, got {value}")
    return value


def _int_validator(minimum: int | None, allow_auto: bool) -> BeforeValidator:
    def check(value: Any) -> Any:
        if allow_auto and value == AUTO:
            return value
        if isinstance(value, str):
            expected = 'an integer or "auto"' if allow_auto else "an integer"
            raise ValueError(f"expected {expected}, got {value!r}")
        return _as_int(value, minimum)

    return BeforeValidator(check)


def _float_validator(minimum: float | None, allow_auto: bool) -> BeforeValidator:
    def check(value: Any) -> Any:
        if allow_auto and value == AUTO:
            return value
        if isinstance(value, bool) or not isinstance(value, int | float):
            expected = 'a number or "auto"' if allow_auto else "a number"
            raise ValueError(f"expected {expected}, got {value!r}")
        if minimum is not None and value < minimum:
            raise ValueError(f"must be >= {minimum}, got {value}")
        return float(value)

    return BeforeValidator(check)


def _bool_or_auto(value: Any) -> Any:
    if value == AUTO or isinstance(value, bool):
        return value
    raise ValueError(f'expected true, false or "auto", got {value!r}')


# Field types. "auto" is allowed exactly where DeepSpeed's documentation allows it.
PositiveInt = Annotated[int, _int_validator(1, allow_auto=False)]
NonNegativeInt = Annotated[int, _int_validator(0, allow_auto=False)]
AnyInt = Annotated[int, _int_validator(None, allow_auto=False)]
PositiveIntOrAuto = Annotated[int | Literal["auto"], _int_validator(1, allow_auto=True)]
NonNegativeIntOrAuto = Annotated[int | Literal["auto"], _int_validator(0, allow_auto=True)]
NonNegativeFloat = Annotated[float, _float_validator(0.0, allow_auto=False)]
NonNegativeFloatOrAuto = Annotated[float | Literal["auto"], _float_validator(0.0, allow_auto=True)]
AnyFloatOrAuto = Annotated[float | Literal["auto"], _float_validator(None, allow_auto=True)]
BoolOrAuto = Annotated[bool | Literal["auto"], BeforeValidator(_bool_or_auto)]


def _interval(value: Any) -> Any:
    if isinstance(value, float) and value == float("inf"):
        return value  # never: accelerate sets steps_per_print to infinity
    return _as_int(value, 1)


# A step interval, or infinity for never.
Interval = Annotated[int | float, BeforeValidator(_interval)]


class Section(BaseModel):
    """A typed config section: unknown keys are errors, instances are immutable."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)


class OpenSection(BaseModel):
    """A section whose extra keys are passed through to a library (e.g. apex AMP)."""

    model_config = ConfigDict(extra="allow", frozen=True, populate_by_name=True)
