"""How the config layer reports problems: the one error type users see for bad configuration,
and the warning for keys that are kept but not used."""

from __future__ import annotations

import warnings


class ConfigError(ValueError):
    """A configuration value breaks a rule.

    The message always starts with the key path (``zero_optimization.stage``) and, when the
    config came from a file, the file, so the user can go straight to the offending line.
    """

    def __init__(self, key_path: str, rule: str, source: str | None = None) -> None:
        self.key_path = key_path
        self.rule = rule
        self.source = source
        where = f"{source}: " if source else ""
        key = f"{key_path}: " if key_path else ""
        super().__init__(f"{where}{key}{rule}")

    def with_source(self, source: str) -> ConfigError:
        """The same error, attributed to a file."""
        return ConfigError(self.key_path, self.rule, source)


class ConfigWarning(UserWarning):
    """A config key that is kept but not used: an unknown top-level key, or a search list at a
    key the engine ignores."""


_warned: set[str] = set()  # keys already warned about in this process


def warn_once(key: str, message: str) -> None:
    """Warn about ``key`` once per process (configs are loaded again for every candidate)."""
    if key not in _warned:
        _warned.add(key)
        warnings.warn(message, ConfigWarning, stacklevel=5)  # the caller of load_config
