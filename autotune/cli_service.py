"""``autotune serve`` and ``autotune submit``: the service's commands. They parse and call
:mod:`autotune.service`; :func:`register` adds them to the command line (``autotune.cli``)."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer

from autotune.cli_options import with_options
from autotune.config import ConfigError
from autotune.run_options import TuningOptions
from autotune.service.settings import (
    DEFAULT_HOST,
    DEFAULT_PORT,
    DEFAULT_STARTUP_LIMIT_S,
    DEFAULT_STATE_DIR,
    TOKEN_ENV,
)

_TokenFileOption = Annotated[
    Path | None,
    typer.Option(help=f"A file whose first line is the token (default: ${TOKEN_ENV})."),
]


def register(app: typer.Typer, fail: Callable[[str], typer.Exit]) -> None:
    """Add ``serve`` and ``submit`` to ``app``; ``fail`` turns a message into the one-line
    error and exit 2 every command gives bad input."""

    @app.command()
    def serve(
        host: Annotated[
            str, typer.Option(help="Address to listen on; beyond loopback only with a token.")
        ] = DEFAULT_HOST,
        port: Annotated[int, typer.Option(min=1, max=65535)] = DEFAULT_PORT,
        state_dir: Annotated[
            Path,
            typer.Option(help="The job queue, each job's results, the default study database."),
        ] = Path(DEFAULT_STATE_DIR),
        storage: Annotated[
            str | None,
            typer.Option(
                help="Where every job's Optuna study goes (a team's postgresql://...); "
                "default: SQLite in the state dir.",
            ),
        ] = None,
        address: Annotated[
            str | None,
            typer.Option(help="An existing Ray cluster to run jobs on (default: a local one)."),
        ] = None,
        token_file: _TokenFileOption = None,
        allow_root: Annotated[
            list[Path] | None,
            typer.Option(
                help="A folder scripts (cwd) and user workloads may come from (repeatable; "
                "default: built-in workloads only).",
            ),
        ] = None,
        allow_installed_modules: Annotated[
            bool,
            typer.Option(
                help="Let a script job run `-m MODULE` of a module installed in this Python "
                "(pip, http.server, ... run whatever they are asked): off, only modules in "
                "an allowed root.",
            ),
        ] = False,
        startup_limit: Annotated[
            float,
            typer.Option(
                min=1,
                help="Seconds a job may take to start its first experiment; past it, it "
                "fails saying where it hung, and the next job starts.",
            ),
        ] = DEFAULT_STARTUP_LIMIT_S,
        runner: Annotated[
            str,
            typer.Option(help="ray: experiments on Ray; local: fresh processes, no Ray."),
        ] = "ray",
        num_cpus: Annotated[
            int | None, typer.Option(min=1, help="CPUs of the local Ray (default: all).")
        ] = None,
    ) -> None:
        """Run the tuning service: an HTTP API and a page, jobs queued and run on Ray, every
        job's study in one storage, answers and fitted constants reused by the next job."""
        from autotune.service.server import serve as run_service
        from autotune.service.settings import (
            ServiceSettings,
            SettingsError,
            check_exposure,
            read_token,
        )

        if runner not in ("ray", "local"):
            raise fail(f"--runner {runner}: expected ray or local")
        missing = _missing_modules("fastapi", "uvicorn", "a2wsgi", "optuna_dashboard", "plotly")
        if missing:
            raise fail(
                f"autotune serve needs {', '.join(missing)}: pip install 'autotune[service]'"
            )
        try:
            token = read_token(token_file)
            check_exposure(host, token)
            roots = tuple(_folder(root, "--allow-root") for root in allow_root or ())
            settings = ServiceSettings(
                host=host,
                port=port,
                state_dir=state_dir,
                storage=storage,
                address=address,
                token=token,
                allowed_roots=roots,
                allow_installed_modules=allow_installed_modules,
                startup_limit_s=startup_limit,
                runner=runner,
                num_cpus=num_cpus,
            )
            run_service(settings)
        except SettingsError as err:
            raise fail(str(err)) from None

    @app.command(context_settings={"ignore_unknown_options": False})
    @with_options(TuningOptions, fail, exclude={"script"})
    def submit(
        server: Annotated[
            str, typer.Option(envvar="AUTOTUNE_SERVER", help="The service, http://host:port.")
        ],
        script: Annotated[
            list[str] | None,
            typer.Argument(
                help="After `--`: a training script on the cluster's shared file system and "
                "its arguments, run in --cwd.",
                show_default=False,
            ),
        ] = None,
        config: Annotated[
            Path | None, typer.Option("--config", "-c", help="DeepSpeed config (sent).")
        ] = None,
        cwd: Annotated[
            Path | None,
            typer.Option(help="Script mode: the folder it runs in (default: this one)."),
        ] = None,
        force: Annotated[
            bool, typer.Option(help="Tune again even if the same job was answered.")
        ] = False,
        wait: Annotated[bool, typer.Option(help="Follow the job until it ends.")] = False,
        token_file: _TokenFileOption = None,
        *,
        options: TuningOptions,
    ) -> None:
        """Submit a tuning job to an autotune service (run's flags), print {id, status,
        cached}; with --wait, follow it and print how it ended (exit 1 unless it succeeded)."""
        from autotune.api import read_config
        from autotune.config.sizes import split_size_error
        from autotune.service.client import Client, ClientError, progress_line
        from autotune.service.settings import SettingsError, read_token

        if split := split_size_error("--device-memory", options.device_memory, script):
            raise fail(split)
        try:
            job: dict[str, Any] = {
                **options.model_dump(mode="json", exclude_none=True, exclude_defaults=True),
                "config": read_config(config) if config is not None else None,
                "force": force,
            }
            if script:
                job["script"] = list(script)
                job["cwd"] = str((cwd or Path.cwd()).resolve())
            client = Client(server, read_token(token_file))
            answer = client.submit({k: v for k, v in job.items() if v is not None})
            typer.echo(json.dumps(answer))
            if not wait:
                return

            def progress(view: dict[str, Any]) -> None:
                typer.echo(progress_line(view), err=True)

            final = client.wait(answer["id"], progress)
        except (ConfigError, SettingsError, ClientError) as err:
            raise fail(str(err)) from None
        typer.echo(json.dumps(final, indent=2))
        if final["status"] != "succeeded":
            raise typer.Exit(1)


def _missing_modules(*names: str) -> list[str]:
    import importlib.util

    return [name for name in names if importlib.util.find_spec(name) is None]


def _folder(path: Path, flag: str) -> Path:
    from autotune.service.settings import SettingsError

    if not path.is_dir():
        raise SettingsError(f"{flag} {path}: not a folder")
    return Path(os.path.realpath(path))
