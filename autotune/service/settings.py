"""How the service was started: where it listens, where it keeps its state, where the jobs'
studies go, which Ray runs them, who may use it.

The service is safe by default: it listens on the loopback address only, and anywhere else
only with a token (:func:`check_exposure`), because whoever can submit a job runs code on the
cluster.
"""

from __future__ import annotations

import ipaddress
import os
import secrets
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

TOKEN_ENV = "AUTOTUNE_TOKEN"
DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8080
DEFAULT_STATE_DIR = "autotune_service"
QUEUE_NAME = "jobs.db"  # the job queue (autotune.service.queue)
STUDIES_NAME = "studies.db"  # the default Optuna storage: every job's study
JOBS_DIR = "jobs"  # one results directory per job
PROFILES_DIR = "hardware"  # the cost model's constants fitted per hardware, for plan
MIN_TOKEN_CHARS = 16  # shorter is guessable: whoever has it runs code on the cluster
# A job that has started no experiment this long after its process started is stuck (a
# workload that hangs at import, a cluster that never places its ranks): it fails, the queue
# moves on.
DEFAULT_STARTUP_LIMIT_S = 600.0


class SettingsError(ValueError):
    """The service cannot start as asked (one line)."""


@dataclass(frozen=True)
class ServiceSettings:
    """What ``autotune serve`` was given.

    Attributes:
        host: the address it binds (loopback by default).
        port: its port.
        state_dir: the queue, each job's results directory, the default study storage and
            the fitted hardware profiles.
        storage: where every job's Optuna study goes (None: SQLite in ``state_dir``); a
            team's database (``postgresql://...``) shares answers between services.
        address: an existing Ray cluster (None: a local one the service starts).
        token: the bearer token every API request but health needs (None: none needed,
            which only a loopback host allows).
        allowed_roots: folders a script job's ``cwd`` and a user workload's module may be in
            (none: only built-in workloads).
        allow_installed_modules: whether a script job may run ``-m MODULE`` of a module
            installed in the service's Python (``pip``, ``http.server``, ...), not only one in
            an allowed root.
        startup_limit_s: how long a job's process may take to start its first experiment.
        runner: ``ray`` (the jobs' experiments on Ray) or ``local`` (fresh processes on this
            machine, no Ray: for a laptop or tests).
        num_cpus: CPUs of the local Ray the service starts (None: all).
    """

    host: str = DEFAULT_HOST
    port: int = DEFAULT_PORT
    state_dir: Path = Path(DEFAULT_STATE_DIR)
    storage: str | None = None
    address: str | None = None
    token: str | None = None
    allowed_roots: tuple[Path, ...] = field(default_factory=tuple)
    allow_installed_modules: bool = False
    startup_limit_s: float = DEFAULT_STARTUP_LIMIT_S
    runner: str = "ray"
    num_cpus: int | None = None

    def __post_init__(self) -> None:
        if self.token is not None and len(self.token) < MIN_TOKEN_CHARS:
            raise SettingsError(
                f"the token has {len(self.token)} characters: use at least {MIN_TOKEN_CHARS} "
                f"(e.g. {TOKEN_ENV}={secrets.token_hex(16)})"
            )
        if not self.startup_limit_s > 0:
            raise SettingsError(f"--startup-limit {self.startup_limit_s}: expected seconds > 0")

    @property
    def storage_url(self) -> str:
        """The Optuna storage every job's study lives in."""
        if self.storage:
            return self.storage
        return f"sqlite:///{(self.state_dir / STUDIES_NAME).resolve()}"

    @property
    def secret_values(self) -> tuple[str, ...]:
        """What no job may be handed: the token and the storage URL's password."""
        password = url_password(self.storage_url)
        return tuple(secret for secret in (self.token, password) if secret)

    @property
    def queue_path(self) -> Path:
        return self.state_dir / QUEUE_NAME

    @property
    def jobs_dir(self) -> Path:
        return self.state_dir / JOBS_DIR

    @property
    def profiles_dir(self) -> Path:
        return self.state_dir / PROFILES_DIR


def read_token(token_file: Path | None) -> str | None:
    """The token: the file's first line where one is given, else ``AUTOTUNE_TOKEN``; None
    where neither is set.

    Raises:
        SettingsError: the file cannot be read, or is empty.
    """
    if token_file is not None:
        try:
            text = token_file.read_text(encoding="utf-8").strip()
        except OSError as err:
            raise SettingsError(f"--token-file {token_file}: {err.strerror or err}") from None
        if not text:
            raise SettingsError(f"--token-file {token_file}: the file is empty")
        return text.splitlines()[0].strip()
    token = os.environ.get(TOKEN_ENV, "").strip()
    return token or None


def without_secrets(environment: Mapping[str, str], hidden: Iterable[str]) -> dict[str, str]:
    """``environment`` less :data:`TOKEN_ENV` and every variable whose value holds one of
    the ``hidden`` values: what a job's processes (and Ray's, which a job's ranks run in) may see.

    Example:
        >>> without_secrets({"AUTOTUNE_TOKEN": "t", "DB": "pg://u:pw@h", "HOME": "/h"}, ["pw"])
        {'HOME': '/h'}
    """
    held = [secret for secret in hidden if secret]
    return {
        name: value
        for name, value in environment.items()
        if name != TOKEN_ENV and not any(secret in value for secret in held)
    }


def url_password(url: str) -> str | None:
    """The password a database URL holds (``postgresql://user:PASSWORD@host/db``), if any.

    Example:
        >>> url_password("postgresql://me:s3cret@db/autotune"), url_password("sqlite:///x.db")
        ('s3cret', None)
    """
    if "://" not in url or "@" not in url:
        return None
    credentials = url.split("://", 1)[1].rsplit("@", 1)[0]
    password = credentials.partition(":")[2]
    return password or None


def url_without_password(url: str) -> str:
    """``url`` with its password left out (the user kept): what a job's files may record.

    Example:
        >>> url_without_password("postgresql://me:s3cret@db/autotune")
        'postgresql://me@db/autotune'
    """
    password = url_password(url)
    if password is None:
        return url
    scheme, rest = url.split("://", 1)
    credentials, host = rest.rsplit("@", 1)
    return f"{scheme}://{credentials.partition(':')[0]}@{host}"


# The URLs whose passwords this process's connections are given, and the listener that does.
_LENT: dict[str, Callable[..., None]] = {}


def lend_password(url: str) -> str:
    """``url`` without its password, which this process's database connections to the same
    place are given as they connect (SQLAlchemy's ``do_connect``): so a job's study is opened
    by a URL its files may record (``study.json``, ``fingerprint.json``) and its processes'
    environment never holds.

    Example:
        >>> lend_password("sqlite:///x.db")
        'sqlite:///x.db'
    """
    bare = url_without_password(url)
    if bare == url or url in _LENT:
        return bare
    from sqlalchemy import event
    from sqlalchemy.engine import Engine, make_url

    full, plain = make_url(url), make_url(bare)

    def give(dialect: Any, record: Any, cargs: list[Any], cparams: dict[str, Any]) -> None:
        plain_args, plain_params = dialect.create_connect_args(plain)
        if list(cargs) != list(plain_args) or any(
            cparams.get(key) != value for key, value in plain_params.items()
        ):
            return  # another database, or one asked with its own password
        full_args, full_params = dialect.create_connect_args(full)
        cargs[:] = full_args
        cparams.update(full_params)

    event.listen(Engine, "do_connect", give)
    _LENT[url] = give
    return bare


def is_loopback(host: str) -> bool:
    """Whether ``host`` is reachable from this machine only.

    Example:
        >>> is_loopback("127.0.0.1"), is_loopback("localhost"), is_loopback("0.0.0.0")
        (True, True, False)
    """
    if host.strip().lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:  # a host name: it may resolve anywhere
        return False


def check_exposure(host: str, token: str | None) -> None:
    """Refuse to listen beyond this machine without a token: anyone who reaches the port
    could run code on the cluster.

    Raises:
        SettingsError: ``host`` is not a loopback address, and no token is set.
    """
    if token is None and not is_loopback(host):
        raise SettingsError(
            f"--host {host} opens the service beyond this machine: set a token first "
            f"({TOKEN_ENV}=..., or --token-file FILE), e.g. {TOKEN_ENV}={secrets.token_hex(16)}"
        )


def token_matches(given: str | None, token: str) -> bool:
    """A constant-time comparison, so that timing does not reveal the token."""
    return given is not None and secrets.compare_digest(given.encode(), token.encode())
