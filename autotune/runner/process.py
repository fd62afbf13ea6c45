"""What runners and ranks need of their process and host: environment entries set for a while,
torchrun's variables, a free port or one held for a rendezvous, the time, the process's own
status, and the import path that makes a fresh process import this autotune."""

from __future__ import annotations

import contextlib
import os
import socket
import sys
from collections.abc import Callable, Iterator, Mapping, MutableMapping
from datetime import datetime, timezone
from typing import Any, TypeVar
from urllib.parse import urlsplit

_V = TypeVar("_V")


@contextlib.contextmanager
def entries_set(mapping: MutableMapping[str, _V], updates: Mapping[str, _V]) -> Iterator[None]:
    """``mapping`` holds ``updates`` inside the block; each key's earlier value (or absence)
    comes back after it. For ``os.environ`` and ``sys.modules`` in long-lived rank processes."""
    saved = {key: mapping.get(key) for key in updates}
    mapping.update(updates)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                mapping.pop(key, None)
            else:
                mapping[key] = value


def interpreter_dirs() -> tuple[str, ...]:
    """The interpreter's own directories (stdlib, site-packages live under them)."""
    return tuple({sys.prefix, sys.base_prefix, sys.exec_prefix})


def _package_dir() -> str:
    """The folder of this autotune package (``.../autotune``)."""
    return os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def own_import_root() -> str | None:
    """The folder this autotune package is imported from, for the import path of a fresh
    process (a Ray worker, a torchrun rank); None where it is installed in the interpreter.

    An editable install (``pip install -e``, as ``install.sh`` does) imports autotune through
    a finder that Python consults only after every folder on ``sys.path``. A fresh process
    whose path holds a folder with an ``autotune`` directory without ``__init__.py`` (a clone
    of autotune seen from the folder above it: Ray and ``python -m`` put the working
    directory first) then imports that directory as a namespace package, and
    ``autotune.results.files`` is not found. With this folder anywhere on the path, the real
    package wins: a package with ``__init__.py`` beats a namespace portion wherever each is.

    Example:
        >>> import autotune
        >>> root = own_import_root()
        >>> root is None or os.path.isfile(os.path.join(root, "autotune", "__init__.py"))
        True
    """
    root = os.path.dirname(_package_dir())
    return None if root.startswith(interpreter_dirs()) else root


def forget_modules_from_outside() -> list[str]:
    """Drop from ``sys.modules`` every module loaded from a file outside the interpreter's
    directories and autotune's own package: a user's code, which the next import reads
    afresh, as a new process would. Installed libraries stay imported. The names dropped.

    Example:
        >>> import types
        >>> module = types.ModuleType("edited_since")
        >>> module.__file__ = "/no/such/folder/edited_since.py"
        >>> sys.modules["edited_since"] = module
        >>> "edited_since" in forget_modules_from_outside(), "edited_since" in sys.modules
        (True, False)
    """
    kept = tuple(os.path.join(folder, "") for folder in (*interpreter_dirs(), _package_dir()))
    files = {name: getattr(module, "__file__", None) for name, module in list(sys.modules.items())}
    outside = [
        name
        for name, file in files.items()
        if isinstance(file, str) and not os.path.abspath(file).startswith(kept)
    ]
    for name in outside:
        del sys.modules[name]
    return outside


def torchrun_env(world_size: int, rank: int, init_method: str, device: Any) -> dict[str, str]:
    """torchrun's variables for ``rank``; MASTER_* from a ``tcp://host:port`` rendezvous
    (``env://`` keeps the ones already set). One node: the local rank is the rank, except on
    a GPU that Ray gives each actor alone (then it is that GPU's index)."""
    env = {
        "RANK": str(rank),
        "WORLD_SIZE": str(world_size),
        "LOCAL_RANK": str(device.index if device.type == "cuda" else rank),
        "LOCAL_WORLD_SIZE": str(world_size),
        "GROUP_RANK": "0",
    }
    url = urlsplit(init_method)
    if url.scheme == "tcp" and url.hostname and url.port:
        env.update(MASTER_ADDR=url.hostname, MASTER_PORT=str(url.port))
    return env


def proc_status() -> dict[str, int]:
    """Numeric fields of /proc/self/status (VmRSS and VmHWM in KiB, Threads); empty off Linux."""
    fields: dict[str, int] = {}
    try:
        with open("/proc/self/status") as status:
            for line in status:
                name, _, value = line.partition(":")
                first = value.split()[:1]
                if first and first[0].isdigit():
                    fields[name] = int(first[0])
    except OSError:
        pass
    return fields


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nobody listens on right now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


class PortReservation:
    """A TCP port held for an experiment's rendezvous until :meth:`close`.

    A port that was merely free when picked goes back to the pool the OS hands out, and any
    process may take it before rank 0's store binds it (measured: an experiment recorded as
    ``DistNetworkError ... EADDRINUSE``). Held by a socket bound with ``SO_REUSEADDR`` and not
    listening, the port is refused to every other bind and to outgoing connections, while
    the store, which binds with ``SO_REUSEADDR`` too, can still listen on it.
    """

    def __init__(self, port: int, sock: socket.socket | None = None) -> None:
        self.port = port
        self._socket = sock

    def close(self) -> None:
        if self._socket is not None:
            self._socket.close()
            self._socket = None


def reserve_port(host: str = "127.0.0.1") -> PortReservation:
    """A port on ``host`` that the OS picks, held (see :class:`PortReservation`).

    Example:
        >>> reservation = reserve_port()
        >>> reservation.port > 0
        True
        >>> reservation.close()
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, 0))
    except OSError:
        sock.close()
        raise
    return PortReservation(int(sock.getsockname()[1]), sock)


PortReserver = Callable[[str], PortReservation]
"""How a runner holds its rendezvous port: :func:`reserve_port`; tests inject collisions."""


def utc_now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds")
