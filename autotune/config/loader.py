"""Reading a config: JSON parsing, search lists, validation, cross-field rules, the batch triad,
and the :class:`Config` all that makes.

Every problem becomes a :class:`ConfigError` naming the key path and the rule broken.
"""

from __future__ import annotations

import copy
import difflib
import json
import typing
import warnings
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field, ValidationError, model_validator

from autotune.config.errors import ConfigError
from autotune.config.keys import get_field, nested, parent_of
from autotune.config.knobs import ALL_STAGES, KNOB_BY_KEY, SEARCHABLE_KEYS, STAGE_KEY
from autotune.config.overrides import overridden, with_search_lists
from autotune.config.schema import (
    AUTO,
    TRIAD,
    DeepSpeedConfig,
    OffloadDevice,
    known_keys,
    model_field,
    spellings,
    submodel,
)


def load_config(source: str | Path | Mapping[str, Any] | Config, world_size: int = 1) -> Config:
    """Read and validate a DeepSpeed-style config.

    Args:
        source: a path to a JSON file, a dict, or an already loaded :class:`Config`.
        world_size: number of data-parallel ranks, used to resolve the batch triad.

    Returns:
        The validated config. Any two of ``train_batch_size``, ``train_micro_batch_size_per_gpu``
        and ``gradient_accumulation_steps`` fill in the third; lists at searchable keys
        (``"zero_optimization": {"stage": [1, 2]}``, or ``"all"``) are kept in
        ``config.search_space`` instead of being rejected.

    Raises:
        ConfigError: naming the key path and the rule broken.

    Example:
        >>> cfg = load_config({"train_batch_size": 32, "gradient_accumulation_steps": 2}, 2)
        >>> cfg.train_micro_batch_size_per_gpu
        8
    """
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise ConfigError("world_size", f"must be a positive integer, got {world_size!r}")
    if isinstance(source, Config):
        source = source.spec
    if isinstance(source, str | Path):
        path = str(source)
        raw = read_json(path)
        try:
            return _load(raw, world_size)
        except ConfigError as err:
            raise err.with_source(path) from None
    if isinstance(source, Mapping):
        return _load(copy.deepcopy(dict(source)), world_size)
    raise ConfigError("", f"expected a path to a JSON file or a dict, got {type(source).__name__}")


def read_json(path: str | Path) -> dict[str, Any]:
    """A JSON object from a file; malformed JSON, duplicate keys and a missing file are errors."""
    file = Path(path)
    if not file.exists():
        raise ConfigError("", "config file not found", str(path))
    if not file.is_file():
        raise ConfigError("", "is not a file", str(path))
    try:
        text = file.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise ConfigError("", f"cannot read: {err}", str(path)) from None
    try:
        data = json.loads(text, object_pairs_hook=_KeyCheckedObject.from_pairs)
    except json.JSONDecodeError as err:
        raise ConfigError(
            "", f"malformed JSON at line {err.lineno}, column {err.colno}: {err.msg}", str(path)
        ) from None
    if not isinstance(data, dict):
        raise ConfigError("", f"the top level must be a JSON object, got {type(data).__name__}")
    duplicate = _find_duplicate(data, "")
    if duplicate:
        raise ConfigError(duplicate, "duplicate key (JSON keeps only the last one)", str(path))
    return _plain(data)


class _KeyCheckedObject(dict[str, Any]):
    """A JSON object that remembers keys that appeared twice."""

    duplicates: list[str]

    @classmethod
    def from_pairs(cls, pairs: list[tuple[str, Any]]) -> _KeyCheckedObject:
        obj = cls()
        obj.duplicates = []
        for key, value in pairs:
            if key in obj:
                obj.duplicates.append(key)
            obj[key] = value
        return obj


def _find_duplicate(node: Any, path: str) -> str | None:
    if isinstance(node, _KeyCheckedObject) and node.duplicates:
        return _join(path, node.duplicates[0])
    children: Iterator[tuple[str, Any]]
    if isinstance(node, dict):
        children = ((_join(path, k), v) for k, v in node.items())
    elif isinstance(node, list):
        children = ((f"{path}[{i}]", v) for i, v in enumerate(node))
    else:
        return None
    for child_path, child in children:
        found = _find_duplicate(child, child_path)
        if found:
            return found
    return None


def _plain(node: Any) -> Any:
    if isinstance(node, dict):
        return {k: _plain(v) for k, v in node.items()}
    if isinstance(node, list):
        return [_plain(v) for v in node]
    return node


def _join(prefix: str, key: str) -> str:
    return f"{prefix}.{key}" if prefix else key


# --- loading -----------------------------------------------------------------------------------


def _load(raw: dict[str, Any], world_size: int) -> Config:
    spec = copy.deepcopy(raw)
    foreign = _split_foreign(raw)
    search_space = _extract_search_space(raw)
    sections = validate_section(DeepSpeedConfig, raw, "")
    _check_rules(sections, search_space)
    given = [None if k in search_space else _not_auto(getattr(sections, k)) for k in TRIAD]
    resolved = resolve_batch_triad(given[0], given[1], given[2], world_size=world_size)
    triad = {k: v for k, v in zip(TRIAD, resolved, strict=True) if v is not None}
    # Everything is validated by now; constructing keeps which keys the user set, which
    # to_dict() writes back.
    return Config.model_construct(
        sections.model_fields_set | triad.keys(),
        **{**dict(sections), **triad},
        spec=spec,
        search_space=search_space,
        world_size=world_size,
        foreign_keys=foreign,
    )


class Config(DeepSpeedConfig):
    """A validated DeepSpeed config, as :func:`load_config` makes it.

    Beside the sections it holds how it was loaded (what the user wrote, the search lists, the
    world size the batch triad was resolved for), so :meth:`with_overrides` loads the user's
    own config again with a candidate's values. These are required fields, and a Config made by
    hand must be what they load to, so none exists that would lose what the user wrote; they
    are not config keys (``to_dict()`` leaves them out). Treat them as read-only.
    """

    spec: dict[str, Any] = Field(
        exclude=True,
        description="The config as the user wrote it, before the batch triad was filled in.",
    )
    search_space: dict[str, tuple[Any, ...]] = Field(
        exclude=True,
        description='Keys holding several values to try: {"zero_optimization.stage": (1, 2)}.',
    )
    world_size: int = Field(
        exclude=True, ge=1, description="The data-parallel ranks the batch triad is resolved for."
    )
    foreign_keys: dict[str, Any] = Field(
        exclude=True,
        description="Unknown top-level keys, kept as written (DeepSpeed ignores them, so does "
        "the engine).",
    )

    @model_validator(mode="after")
    def _is_what_its_spec_loads_to(self) -> Config:
        # load_config constructs without validating again, so this runs only for a Config made
        # by hand: one whose sections differ from its spec would change under with_overrides.
        if load_config(self.spec, self.world_size) != self:
            raise ValueError(
                "the sections differ from what spec loads to; make a Config with load_config"
            )
        return self

    @property
    def is_concrete(self) -> bool:
        """True when nothing is left to search and the batch triad is fully resolved."""
        triad = (getattr(self, key) for key in TRIAD)
        return not self.search_space and all(isinstance(v, int) for v in triad)

    def to_dict(self, full: bool = False) -> dict[str, Any]:
        """The config as JSON-ready data; ``load_config(cfg.to_dict()) == cfg``.

        Args:
            full: include every default, not only what was set (and the resolved triad).
        """
        data = self.model_dump(mode="json", exclude_unset=not full, exclude_none=full)
        data.update(copy.deepcopy(self.foreign_keys))
        return with_search_lists(data, self.search_space)

    def get(self, key: str, default: Any = None) -> Any:
        """``key`` of :meth:`to_dict`: DeepSpeed's ``engine.config`` is the config dict, and
        clients read it so (``engine.config.get("zero_optimization", {}).get("stage")``)."""
        return self.to_dict().get(key, default)

    def to_json(self, full: bool = False, indent: int | None = 2) -> str:
        return json.dumps(self.to_dict(full=full), indent=indent)

    def with_overrides(self, overrides: Mapping[str, Any]) -> Config:
        """The user's config loaded again with dotted keys replaced, everything else kept.

        Overriding the micro-batch keeps a ``train_batch_size`` the user fixed (accumulation is
        derived again) and otherwise keeps the user's accumulation (the global batch follows).

        Raises:
            ConfigError: if the result breaks a rule.
        """
        return load_config(overridden(self.spec, overrides), world_size=self.world_size)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Config):
            return NotImplemented
        return (
            self.model_dump() == other.model_dump()
            and self.search_space == other.search_space
            and self.world_size == other.world_size
        )

    __hash__ = None  # type: ignore[assignment]


class ConfigWarning(UserWarning):
    """A config key that is kept but not used: an unknown top-level key, or a search list at a
    key the engine ignores."""


_warned: set[str] = set()  # keys already warned about in this process


def _split_foreign(raw: dict[str, Any]) -> dict[str, Any]:
    """Pop the unknown top-level keys out of ``raw`` and return them, warning once per key.

    DeepSpeed ignores unknown top-level keys, and real configs carry some (launcher settings
    such as ``cuda_visible_devices``, keys of newer or older DeepSpeed versions), so they are
    kept, not refused. A near-miss of a section name is refused instead: DeepSpeed would
    silently train without that section (``zero_optimisation`` means stage 0).
    """
    known = known_keys(DeepSpeedConfig)
    foreign: dict[str, Any] = {}
    for key in [k for k in raw if k not in known]:
        section = _near_section(key)
        if section is not None:
            raise ConfigError(
                key,
                f"unknown key; did you mean {section!r}? (DeepSpeed would ignore this "
                "section and train without it)",
            )
        foreign[key] = raw.pop(key)
        hint = difflib.get_close_matches(key, known, n=1, cutoff=0.75)
        _warn_once(
            key,
            f"config key {key!r} is unknown; kept but not used"
            + (f" (did you mean {hint[0]!r}?)" if hint else ""),
        )
    return foreign


def _warn_once(key: str, message: str) -> None:
    """Warn about ``key`` once per process (configs are loaded again for every candidate)."""
    if key not in _warned:
        _warned.add(key)
        warnings.warn(message, ConfigWarning, stacklevel=5)  # the caller of load_config


def _near_section(key: str) -> str | None:
    """The section name (a key holding an object) that ``key`` is a misspelling of."""
    sections = [
        name
        for name in known_keys(DeepSpeedConfig)
        if _is_section(model_field(DeepSpeedConfig, name))
    ]

    def squash(name: str) -> str:
        return name.lower().replace("_", "").replace("-", "")

    for name in sections:
        if squash(name) == squash(key):
            return name
    close = difflib.get_close_matches(key.lower(), sections, n=1, cutoff=0.8)
    return close[0] if close else None


def _is_section(field: Any) -> bool:
    if field is None:
        return False
    annotation = field.annotation
    if submodel(annotation) is not None:
        return True
    return any(
        arg is dict or typing.get_origin(arg) is dict
        for arg in (annotation, *typing.get_args(annotation))
    )


def _not_auto(value: Any) -> Any:
    return None if value == AUTO else value


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
        path = f"{path}[{key}]" if isinstance(key, int) else _join(path, key)
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


# --- search lists ------------------------------------------------------------------------------


def _extract_search_space(raw: dict[str, Any]) -> dict[str, tuple[Any, ...]]:
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
            _warn_once(
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


# --- rules across fields -----------------------------------------------------------------------


def _check_rules(config: DeepSpeedConfig, search_space: Mapping[str, tuple[Any, ...]]) -> None:
    """Rules that involve more than one key. A searched stage is checked per candidate."""
    if config.optimizer is not None:
        params_model = config.optimizer.params_model()
        if params_model is not None:
            validate_section(params_model, config.optimizer.params, "optimizer.params")
    if config.scheduler is not None:
        scheduler = config.scheduler
        validate_section(scheduler.params_model(), scheduler.params, "scheduler.params")

    fp16, bf16, amp = config.fp16.enabled is True, config.bf16.enabled is True, config.amp.enabled
    if fp16 and bf16:
        raise ConfigError("bf16.enabled", "fp16 and bf16 cannot both be enabled")
    if amp and (fp16 or bf16):
        raise ConfigError("amp.enabled", "amp cannot be combined with fp16 or bf16")

    zero = config.zero_optimization
    offload = zero.offload_optimizer
    for section, path in ((offload, "offload_optimizer"), (zero.offload_param, "offload_param")):
        if section is not None and section.device is OffloadDevice.nvme and not section.nvme_path:
            raise ConfigError(f"zero_optimization.{path}.nvme_path", "required for NVMe offload")

    if "zero_optimization.stage" not in search_space:
        stage = zero.stage
        if amp and stage > 0:
            raise ConfigError(
                "amp.enabled", f"amp is not compatible with ZeRO (zero_optimization.stage={stage})"
            )
        if zero.param_offload_device is not OffloadDevice.none and stage < 3:
            raise ConfigError(
                "zero_optimization.offload_param",
                f"parameter offload needs ZeRO stage 3, got stage {stage}",
            )
        if zero.optimizer_offload_device is OffloadDevice.nvme and stage < 3:
            raise ConfigError(
                "zero_optimization.offload_optimizer.device",
                f"NVMe optimizer offload needs ZeRO stage 3, got stage {stage}",
            )
        if zero.optimizer_offload_device is OffloadDevice.cpu and stage == 0:
            raise ConfigError(
                "zero_optimization.offload_optimizer.device",
                "CPU optimizer offload needs ZeRO stage 1, 2 or 3, got stage 0",
            )

    tuning = config.autotuning
    if tuning.end_profile_step < tuning.start_profile_step:
        raise ConfigError(
            "autotuning.end_profile_step",
            f"must not be less than start_profile_step ({tuning.end_profile_step} < "
            f"{tuning.start_profile_step})",
        )


# --- the batch triad ---------------------------------------------------------------------------


def resolve_batch_triad(
    train_batch_size: int | None,
    micro_batch_size: int | None,
    gradient_accumulation_steps: int | None,
    world_size: int,
) -> tuple[int | None, int | None, int | None]:
    """Fill in the triad ``train_batch_size = micro * accumulation * world_size``.

    Any two given infer the third; all three must agree. With only ``train_batch_size`` or
    only the micro-batch, accumulation is 1 (as in DeepSpeed). With neither, the triad stays
    open: the tuner chooses the micro-batch.

    Raises:
        ConfigError: if the given values cannot agree.
    """
    tbs, mbs, gas, n = train_batch_size, micro_batch_size, gradient_accumulation_steps, world_size
    if tbs is not None and mbs is not None and gas is not None:
        if tbs != mbs * gas * n:
            raise ConfigError(
                "train_batch_size",
                f"{tbs} != train_micro_batch_size_per_gpu {mbs} * gradient_accumulation_steps "
                f"{gas} * world_size {n} = {mbs * gas * n}",
            )
        return tbs, mbs, gas
    if tbs is not None and mbs is not None:
        return tbs, mbs, _divide(tbs, mbs * n, "gradient_accumulation_steps", f"{mbs} * {n}")
    if tbs is not None and gas is not None:
        return tbs, _divide(tbs, gas * n, "train_micro_batch_size_per_gpu", f"{gas} * {n}"), gas
    if mbs is not None:
        gas = gas or 1
        return mbs * gas * n, mbs, gas
    if tbs is not None:
        return tbs, _divide(tbs, n, "train_micro_batch_size_per_gpu", str(n)), 1
    return None, None, gas


def _divide(total: int, divisor: int, inferred_key: str, divisor_text: str) -> int:
    if total % divisor:
        raise ConfigError(
            "train_batch_size",
            f"{total} is not divisible by {divisor_text} (= {divisor}), so {inferred_key} "
            "cannot be a whole number",
        )
    return total // divisor
