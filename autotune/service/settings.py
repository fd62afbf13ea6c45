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
from dataclasses import dataclass, field
from pathlib import Path

TOKEN_ENV = "AUTOTUNE_TOKEN"
DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8080
DEFAULT_STATE_DIR = "autotune_service"
QUEUE_NAME = "jobs.db"  # the job queue (autotune.service.queue)
STUDIES_NAME = "studies.db"  # the default Optuna storage: every job's study
JOBS_DIR = "jobs"  # one results directory per job
PROFILES_DIR = "hardware"  # the cost model's constants fitted per hardware, for plan


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
    runner: str = "ray"
    num_cpus: int | None = None

    @property
    def storage_url(self) -> str:
        """The Optuna storage every job's study lives in."""
        if self.storage:
            return self.storage
        return f"sqlite:///{(self.state_dir / STUDIES_NAME).resolve()}"

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
