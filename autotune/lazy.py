"""Package attributes imported on first use (PEP 562), so that importing a package stays light
and its heavy parts (torch, the engine, pandas) load only for code that asks for them."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Collection, Mapping
from typing import Any


def lazy_getattr(
    package: str,
    attributes: Mapping[str, str],
    submodules: Collection[str] = (),
    not_served: str | None = None,
) -> Callable[[str], Any]:
    """A module-level ``__getattr__`` for ``package``.

    Args:
        package: the package's dotted name, for submodules and error messages.
        attributes: attribute name → the module that defines it.
        submodules: names of ``package.<name>`` modules returned as attributes.
        not_served: for a stand-in of another library: its name, so that a missing attribute
            says it is that library's and not served here.

    Example:
        >>> getattr_ = lazy_getattr("autotune", {"load_results": "autotune.results"})
        >>> getattr_("load_results").__module__
        'autotune.results.frame'
        >>> getattr_("nothing")
        Traceback (most recent call last):
        AttributeError: module 'autotune' has no attribute 'nothing'
    """

    def __getattr__(name: str) -> Any:
        if name in submodules:
            return importlib.import_module(f"{package}.{name}")
        module = attributes.get(name)
        if module is None:
            served = (
                ""
                if not_served is None or name.startswith("__")
                else (f": {not_served}'s {name} is not served by autotune's built-in engine")
            )
            raise AttributeError(f"module {package!r} has no attribute {name!r}{served}")
        return getattr(importlib.import_module(module), name)

    return __getattr__
