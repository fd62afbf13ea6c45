"""The one error type users see for bad configuration."""

from __future__ import annotations


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
