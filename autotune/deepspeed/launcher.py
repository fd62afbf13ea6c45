"""The command ``autotune exec`` runs: torchrun starting a script's ranks with autotune
standing in for DeepSpeed (``python -m autotune.deepspeed SCRIPT``), and the environment the
ranks need to import this autotune; and the training command a tuning run prints, checked
with the script before it is printed."""

from __future__ import annotations

import os
import shlex
import socket
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from autotune.results.files import atomic_write_text
from autotune.runner.process import own_import_root
from autotune.script_target import ScriptError, ScriptTarget, launch_yaml_path

# The longest a script may take to parse its arguments (imports included) when checked.
PARSE_CHECK_TIMEOUT_S = 300.0


def exec_command(
    script: Sequence[str], nproc: int, environ: Mapping[str, str] | None = None
) -> tuple[list[str], dict[str, str]]:
    """torchrun's command line for ``script`` (``["train.py", *args]`` or
    ``["-m", "pkg.train", *args]``) on ``nproc`` ranks, and its environment.

    The script is checked first: a missing one is one error here, not a traceback from each
    rank and from torchrun. ``accelerate launch ...`` and ``trl <command> ...`` are read as
    autotune's tuning runs read them: the ranks get the script and the environment that
    ``accelerate launch`` would give them. The ranks start with the working directory first
    on their path (``-m``); this autotune's folder goes on it too, so that a directory named
    autotune there (a clone, seen from the folder that holds it) cannot shadow it.

    Raises:
        ScriptError: the script or module cannot be found, or its launch cannot run.
    """
    target = ScriptTarget.from_command(script)
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    command = [*torchrun, "--nproc_per_node", str(nproc), "-m", "autotune.deepspeed"]
    command += [*target.script_command(), *target.args] if target.accelerate else script
    env = dict(os.environ if environ is None else environ)
    env.update(target.environment(None, nproc))
    root = own_import_root()
    if root is not None:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [env.get("PYTHONPATH"), root]))
    return command, env


def training_command(
    script: ScriptTarget,
    ds_config: Mapping[str, Any],
    optimal_path: Path,
    launcher: Sequence[str],
    world_size: int,
) -> str:
    """The command that trains ``script`` with ``ds_config`` (written at ``optimal_path``)
    under ``launcher`` (the measuring engine's), in the script's own form (see
    :meth:`ScriptTarget.command`). An Accelerate launch's YAML that names ``optimal_path`` is
    written beside it.

    The command is checked with the script before it is printed. Its arguments are those the
    winning experiment ran (its config file's path aside), launched the same way: that run
    asked the script's parser about them and built the engine from that config, so it is the
    check. Only a script that names no config file of its own gets an argument no experiment
    gave it (``--deepspeed_config FILE``): its parser is asked then (:func:`parse_problem`).

    Returns:
        The command (shell words), or where the script refuses it, a line that says so.
    """
    path = str(optimal_path.resolve())
    if script.accelerate is not None:
        launch = script.accelerate.with_config_file(path, world_size)
        atomic_write_text(launch_yaml_path(path), launch.tuned_yaml())
    command = script.command(ds_config, path, launcher)
    if script.adds_config_argument():
        problem = parse_problem(command[len(launcher) :], world_size)
        if problem is not None:
            return f"(none: the script refused the command made for it: {problem})"
    return shlex.join(command)


def parse_problem(script: Sequence[str], world_size: int) -> str | None:
    """Whether the script accepts ``script``'s arguments, asked of its own parser in a
    process of its own (:mod:`autotune.deepspeed.parse_check`), with the environment its
    launcher gives it as rank 0 of ``world_size``: None, or the script's error in a line."""
    try:
        target = ScriptTarget.from_command(script)
    except ScriptError as err:
        return str(err)
    env = dict(os.environ)
    env.update(target.environment(None, world_size))
    root = own_import_root()
    if root is not None:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [env.get("PYTHONPATH"), root]))
    with socket.socket() as free:  # a world of one, should the script start a process group
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    env.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", LOCAL_WORLD_SIZE="1")
    env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    check = [sys.executable, "-m", "autotune.deepspeed.parse_check"]
    try:
        done = subprocess.run(
            [*check, *target.script_command(), *target.args],
            env=env,
            capture_output=True,
            text=True,
            timeout=PARSE_CHECK_TIMEOUT_S,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return f"its parser did not answer within {PARSE_CHECK_TIMEOUT_S:.0f} s"
    if done.returncode == 0:
        return None
    said = [line.strip() for line in done.stderr.splitlines() if line.strip()]
    return said[-1][:300] if said else f"exit status {done.returncode}"
