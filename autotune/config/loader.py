"""Loading a config: the sections validated, unknown top-level keys kept aside, the search
lists and the batch triad resolved, and the :class:`Config` all that makes.

Every problem becomes a :class:`ConfigError` naming the key path and the rule broken.
"""

from __future__ import annotations

import copy
import difflib
import json
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import Field, model_validator

from autotune.config.errors import ConfigError, warn_once
from autotune.config.fields import AUTO
from autotune.config.json_file import read_json
from autotune.config.keys import known_keys, model_field, submodel
from autotune.config.overrides import overridden
from autotune.config.rules import check_cross_field_rules, resolve_batch_triad
from autotune.config.schema import TRIAD, DeepSpeedConfig
from autotune.config.search_space import extract_search_space, with_search_lists
from autotune.config.validation import validate_section


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


def _load(raw: dict[str, Any], world_size: int) -> Config:
    spec = copy.deepcopy(raw)
    foreign = _split_foreign(raw)
    search_space = extract_search_space(raw)
    sections = validate_section(DeepSpeedConfig, raw, "")
    check_cross_field_rules(sections, search_space)
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
        warn_once(
            key,
            f"config key {key!r} is unknown; kept but not used"
            + (f" (did you mean {hint[0]!r}?)" if hint else ""),
        )
    return foreign


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
