"""Validating a config section against its schema model, with pydantic's errors turned into a
:class:`ConfigError` that names the key path and the rule broken."""

from __future__ import annotations

import difflib
from typing import Any

from pydantic import BaseModel, ValidationError

from autotune.config.errors import ConfigError
from autotune.config.keys import join_key, known_keys
from autotune.config.knobs import SEARCHABLE_KEYS


def validate_section(model: type[BaseModel], data: Any, prefix: str) -> Any:
    """``model.model_validate(data)`` with pydantic's errors turned into a ConfigError."""
    try:
        return model.model_validate(data)
    except ValidationError as err:
        raise _config_error(err, model, prefix) from None


def _config_error(err: ValidationError, model: type[BaseModel], prefix: str) -> ConfigError:
    detail = err.errors()[0]
    loc = [str(p) if not isinstance(p, int) else p for p in detail["loc"]]
    # Union branches add type tags to the location; keep only real keys and list indices.
    keys = [p for p in loc if isinstance(p, int) or (p.isidentifier() and p not in _TYPE_TAGS)]
    path = prefix
    for key in keys:
        path = f"{path}[{key}]" if isinstance(key, int) else join_key(path, key)
    if detail["type"] == "extra_forbidden":
        known = known_keys(model, ".".join(k for k in keys[:-1] if isinstance(k, str)))
        hint = difflib.get_close_matches(str(keys[-1]), known, n=1, cutoff=0.6)
        rule = "unknown key" + (f"; did you mean {hint[0]!r}?" if hint else "")
        return ConfigError(path, rule)
    if detail["type"] == "missing":
        if keys and isinstance(keys[-1], int):
            return ConfigError(path.rsplit("[", 1)[0], "too few items")
        return ConfigError(path, "required key is missing")
    message = detail["msg"].removeprefix("Value error, ")
    message = message[:1].lower() + message[1:]
    value = detail.get("input")
    if isinstance(value, list) and path.lstrip(".") not in SEARCHABLE_KEYS and keys:
        message += (
            " (lists of values to search are allowed only at tunable keys such as"
            " train_micro_batch_size_per_gpu and zero_optimization.stage)"
        )
    elif "got" not in message and repr(value) not in message and not isinstance(value, dict):
        message += f" (got {value!r})"
    return ConfigError(path, message)


_TYPE_TAGS = {"int", "float", "str", "bool", "list", "tuple", "dict", "none", "enum"}
