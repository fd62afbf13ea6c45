"""The signals that stop a run, taken where the run can stop cleanly.

Ctrl-C (SIGINT, also the service's cancel) and the service's SIGTERM stop a run by the
exception their Python handler raises wherever the main thread happens to be. Two places
cannot take it there: :func:`deferred` holds them over a block, and :func:`kept` makes sure
one whose exception Python dropped still stops the run. Signals reach only the main thread;
elsewhere both do nothing.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Callable, Iterator
from typing import Any

# The signals a run stops on, where a Python handler (not SIG_IGN / SIG_DFL) takes them.
STOPPING_SIGNALS = (signal.SIGINT, signal.SIGTERM)
_Handler = Callable[[int, Any], Any]


def _handlers() -> dict[int, _Handler]:
    """The stopping signals' Python handlers, on the main thread; none elsewhere."""
    if threading.current_thread() is not threading.main_thread():
        return {}
    handlers = {signum: signal.getsignal(signum) for signum in STOPPING_SIGNALS}
    return {signum: handler for signum, handler in handlers.items() if callable(handler)}


@contextlib.contextmanager
def deferred() -> Iterator[None]:
    """A stopping signal inside the block takes effect as the block ends; the same one a
    second time, at once.

    For what must not be cut in the middle: while another thread imports, an exception
    raised in one of this thread's own imports can leave Python's import lock held
    (CPython's importlib is not safe against it), and the other thread's next import then
    waits forever (seen: Ctrl-C at the wrong moment of a run's start hung it, 1 try in 10);
    a rank process the forkserver has forked is the driver's to stop only once ``start()``
    returns its pid (seen: Ctrl-C in between left a rank running, unseen, holding the
    terminal's output open for its whole timeout).
    """
    previous = _handlers()
    received: list[int] = []

    def defer(signum: int, frame: Any) -> None:
        if signum in received:  # insisted on: the handler that was there, now
            signal.signal(signum, previous[signum])
            signal.raise_signal(signum)
        received.append(signum)

    for signum in previous:
        signal.signal(signum, defer)
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    for signum in received:
        signal.raise_signal(signum)  # to the handler that was there: as if now


@contextlib.contextmanager
def kept() -> Iterator[Callable[[], None]]:
    """Yields ``deliver_lost``: called where the caller can stop, it calls the handler of
    each stopping signal received in the block again, as its exception was lost on the way.

    Python prints and drops an exception raised inside a garbage-collection callback or a
    ``__del__``: a signal landing there stops nothing (seen: the service's cancel, lost so,
    let the job run to its end). A signal whose exception did propagate leaves the block
    with it, so nothing is delivered twice.
    """
    previous = _handlers()
    received: list[int] = []

    def note(signum: int, frame: Any) -> None:
        received.append(signum)
        previous[signum](signum, frame)

    def deliver_lost() -> None:
        lost, received[:] = received[:], []
        for signum in lost:
            previous[signum](signum, None)

    for signum in previous:
        signal.signal(signum, note)
    try:
        yield deliver_lost
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
