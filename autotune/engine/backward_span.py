"""Whether a backward pass is running now, for counting the collectives that overlap with it
(what ``overlap_comm`` is for; tests read the counts to see that a knob works).

torch answers for any backward with ``torch._C._current_graph_task_id()``, a private function
that a later torch may drop or change. It is probed once, at import; where it is missing or
misbehaves the engine's own :func:`engine_backward` span answers instead. That span is the
same one for the engine's collectives: they are launched in backward only from the gradient
and parameter hooks that ``ZeroEngine.backward``'s autograd call runs.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch


def probe_graph_task_id() -> Callable[[], int] | None:
    """torch's current-graph-task query if it is there and says "none" outside backward."""
    query = getattr(torch._C, "_current_graph_task_id", None)
    if query is None:
        return None
    try:
        return query if query() == -1 else None
    except Exception:  # a changed signature: use the engine's own span
        return None


_graph_task_id = probe_graph_task_id()
_engine_backward_depth = 0  # nested: a backward run inside a hook of another


@contextmanager
def engine_backward() -> Iterator[None]:
    """Marks the engine's autograd call as backward, for :func:`in_backward`'s fallback."""
    global _engine_backward_depth
    _engine_backward_depth += 1
    try:
        yield
    finally:
        _engine_backward_depth -= 1


def in_backward() -> bool:
    """Whether autograd is running a backward pass (with the fallback: the engine's)."""
    if _graph_task_id is not None:
        return _graph_task_id() != -1
    return _engine_backward_depth > 0
