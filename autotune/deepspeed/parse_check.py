"""``python -m autotune.deepspeed.parse_check SCRIPT [ARGS...]`` (or ``-m MODULE ...``): does
the training script accept these arguments? Asked of the script itself, without training.

The script runs as ``python -m autotune.deepspeed`` would run it (autotune standing in for
DeepSpeed, the environment as given), until its parser has returned: argparse's
``parse_args``, or transformers' ``HfArgumentParser`` (``parse_args_into_dataclasses``,
``parse_dict``, ``parse_json_file``, ``parse_yaml_file``: the HF Trainer's scripts, TRL's,
LLaMA-Factory's), whose dataclasses check their values as they are made (the HF Trainer reads
an Accelerate launch's DeepSpeed settings there). A script that parses nothing is stopped when
it hands its config to ``deepspeed.initialize``. Exit status 0: accepted; otherwise the
script's own error is the last line on stderr.

Used by :func:`autotune.deepspeed.launcher.training_command` before a training command is
printed.
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import os
import runpy
import sys
from collections.abc import Callable
from typing import Any

from autotune.deepspeed.stand_in import install

USAGE = "usage: python -m autotune.deepspeed.parse_check SCRIPT [ARGS...] | -m MODULE [ARGS...]"
_HF_PARSES = ("parse_args_into_dataclasses", "parse_dict", "parse_json_file", "parse_yaml_file")


class Parsed(BaseException):
    """The script's parser returned: raised to end the script's run there (a BaseException,
    so that the script's ``except Exception`` does not catch it)."""


def _then_stop(parse: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(parse)
    def parsed(*args: Any, **kwargs: Any) -> Any:
        parse(*args, **kwargs)
        raise Parsed

    return parsed


class _StopAtInitialize:
    """An engine observer that ends the run when the script hands its config over."""

    def configure(self, config: Any) -> Any:
        raise Parsed

    def on_engine(self, engine: Any) -> None:
        raise Parsed

    def on_forward(self, engine: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        raise Parsed

    def on_optimizer_step(self, engine: Any) -> None:
        raise Parsed


def main(argv: list[str]) -> None:
    if not argv or (argv[0] == "-m" and len(argv) < 2):
        sys.exit(USAGE)
    install()
    argparse.ArgumentParser.parse_args = _then_stop(argparse.ArgumentParser.parse_args)  # type: ignore[method-assign]
    if importlib.util.find_spec("transformers") is not None:
        # Imported standing in, so that the script's transformers is this one, wrapped.
        from transformers import HfArgumentParser

        for name in _HF_PARSES:
            setattr(HfArgumentParser, name, _then_stop(getattr(HfArgumentParser, name)))
    from autotune.engine import hooks

    try:
        with hooks.observing(_StopAtInitialize()):
            if argv[0] == "-m":
                sys.argv = [argv[1], *argv[2:]]
                sys.path.insert(0, os.getcwd())
                runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
            else:
                sys.argv = list(argv)
                sys.path[0] = os.path.dirname(os.path.abspath(argv[0]))
                runpy.run_path(argv[0], run_name="__main__")
    except Parsed:
        pass
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # whatever the script left running (a process group, threads) stays unjoined


if __name__ == "__main__":
    main(sys.argv[1:])
