"""Where a runner watches and steers an engine that a user's own script builds.

In script mode the training script calls ``initialize()`` itself, yet the tuner must decide
the config and time the profile window. A runner installs an :class:`EngineObserver` for the
length of one experiment (:func:`observing`); the engine consults it when it is built and after
each optimizer step. With none installed (ordinary training) nothing changes. Torch-free, so a
runner can import it without the engine.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Protocol


class EngineObserver(Protocol):
    def configure(self, config: Any) -> Any:
        """The config to build the engine with, given what the script passed (or None)."""
        ...

    def on_engine(self, engine: Any) -> None:
        """The engine was built: its optimizer, scheduler and loader settings are final."""
        ...

    def on_forward(self, engine: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        """The engine is about to run the model on these inputs."""
        ...

    def on_optimizer_step(self, engine: Any) -> None:
        """An optimizer step (a gradient-accumulation boundary) finished, skipped or not."""
        ...


_observer: EngineObserver | None = None


def current() -> EngineObserver | None:
    """The observer installed now, if any."""
    return _observer


@contextmanager
def observing(observer: EngineObserver) -> Iterator[EngineObserver]:
    """Install ``observer`` for the block; one at a time per process."""
    global _observer
    if _observer is not None:
        raise RuntimeError("an engine observer is already installed in this process")
    _observer = observer
    try:
        yield observer
    finally:
        _observer = None
