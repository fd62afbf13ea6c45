"""The ``autotune`` command line. It parses arguments and calls the library; no logic lives here."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated

import typer

from autotune.config import ConfigError

app = typer.Typer(
    name="autotune",
    help="Find the fastest ZeRO data-parallel training config for a PyTorch model.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

EXIT_BAD_INPUT = 2


def fail(message: str) -> typer.Exit:
    """Print a one-line error and return the exit to raise (code 2: bad input)."""
    typer.echo(f"error: {message}", err=True)
    return typer.Exit(EXIT_BAD_INPUT)


@app.command()
def validate(
    config: Annotated[Path, typer.Argument(help="A DeepSpeed-style JSON config.")],
    world_size: Annotated[
        int, typer.Option("--world-size", "-n", min=1, help="Data-parallel ranks.")
    ] = 1,
    full: Annotated[bool, typer.Option("--full", help="Show every default too.")] = False,
) -> None:
    """Check a config and print it resolved (batch triad filled in), or the first error."""
    from autotune.config import load_config

    try:
        cfg = load_config(config, world_size=world_size)
    except ConfigError as err:
        raise fail(str(err)) from None
    typer.echo(json.dumps(cfg.to_dict(full=full), indent=2))
    if cfg.search_space:
        keys = ", ".join(f"{k} ({len(v)} values)" for k, v in cfg.search_space.items())
        typer.echo(f"search space: {keys}", err=True)
    if not isinstance(cfg.train_micro_batch_size_per_gpu, int):
        typer.echo("batch size: left to the tuner (no micro-batch fixed)", err=True)


@app.callback()
def _group() -> None:
    """Keeps subcommands as subcommands even while only one exists."""


def main() -> None:
    """Console entry point: bad input exits 2 with one line, Ctrl-C exits 130, no tracebacks.

    Usage errors are Typer's own (exit 2); commands turn library errors into :func:`fail`.
    """
    try:
        app()
    except KeyboardInterrupt:
        typer.echo("interrupted", err=True)
        sys.exit(130)
