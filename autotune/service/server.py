"""``autotune serve``: the state directory opened, Ray joined or started, the scheduler and
the HTTP server run until Ctrl-C."""

from __future__ import annotations

import contextlib
import socket
import sqlite3
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING

from autotune.service.queue import JobQueue
from autotune.service.settings import STUDIES_NAME, ServiceSettings, SettingsError

if TYPE_CHECKING:
    import optuna


def serve(settings: ServiceSettings) -> None:
    """Run the service until interrupted; jobs it was running resume when it starts again.

    Raises:
        SettingsError: the port is taken, the state directory or the storage cannot be used.
    """
    import uvicorn

    from autotune.service.app import create_app
    from autotune.service.scheduler import Scheduler

    _check_port(settings.host, settings.port)
    queue = open_queue(settings)
    resumed = queue.requeue_interrupted()
    storage = open_storage(settings)
    ray_address, gpus = None, None
    if settings.runner == "ray":
        ray_address, gpus = _join_ray(settings)
    scheduler = Scheduler(settings, queue, gpus or (lambda: 0.0), ray_address)
    app = create_app(settings, queue, storage, scheduler.wake)
    scheduler.start()
    where = f"http://{settings.host}:{settings.port}"
    print(
        f"autotune serve: {where} (state in {settings.state_dir}; studies in "
        f"{_shown(settings.storage_url)}; "
        + (f"Ray at {ray_address}" if ray_address else "experiments as local processes")
        + (f"; {len(resumed)} interrupted job(s) resume" if resumed else "")
        + ("; token required" if settings.token else "")
        + ")",
        file=sys.stderr,
        flush=True,
    )
    try:
        uvicorn.run(app, host=settings.host, port=settings.port, log_level="warning")
    finally:
        scheduler.stop()
        if ray_address is not None and settings.address is None:
            from autotune.runner.ray_cluster import shutdown_ray

            shutdown_ray()


def open_queue(settings: ServiceSettings) -> JobQueue:
    try:
        settings.state_dir.mkdir(parents=True, exist_ok=True)
        return JobQueue(settings.queue_path)
    except (OSError, sqlite3.Error) as err:
        raise SettingsError(f"--state-dir {settings.state_dir}: {err}") from None


def open_storage(settings: ServiceSettings) -> optuna.storages.BaseStorage:
    """The Optuna storage every job's study goes in; the default SQLite file in WAL mode, so
    that the page reads while a job writes."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    if settings.storage is None:
        with contextlib.closing(sqlite3.connect(settings.state_dir / STUDIES_NAME)) as db:
            db.execute("PRAGMA journal_mode=WAL")
    try:
        return optuna.storages.get_storage(settings.storage_url)
    except Exception as err:  # a bad URL, an unreachable database, a driver missing
        raise SettingsError(f"--storage {_shown(settings.storage_url)}: {err}") from None


def _join_ray(settings: ServiceSettings) -> tuple[str, Callable[[], float]]:
    """Join the cluster at ``--address``, or start a local one; its address, and a function
    that counts its GPUs."""
    import ray

    from autotune.runner.ray_cluster import connect_ray

    try:
        connect_ray(settings.address, settings.num_cpus, quiet=True)
    except (ConnectionError, RuntimeError, ValueError) as err:
        raise SettingsError(f"--address {settings.address}: {err}") from None
    address = str(ray.get_runtime_context().gcs_address)
    return address, lambda: float(ray.cluster_resources().get("GPU", 0.0))


def _check_port(host: str, port: int) -> None:
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host.strip("[]"), port))
        except OSError as err:
            raise SettingsError(f"--host {host} --port {port}: {err.strerror or err}") from None


def _shown(url: str) -> str:
    """A storage URL without its password."""
    if "://" not in url or "@" not in url:
        return url
    scheme, rest = url.split("://", 1)
    credentials, host = rest.rsplit("@", 1)
    user = credentials.split(":", 1)[0]
    return f"{scheme}://{user}:***@{host}" if ":" in credentials else url
