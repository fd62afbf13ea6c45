"""The command ``autotune exec`` runs: torchrun starting a script's ranks with autotune
standing in for DeepSpeed (``python -m autotune.deepspeed SCRIPT``), and the environment the
ranks need to import this autotune."""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence

from autotune.runner.process import own_import_root
from autotune.script_target import ScriptTarget


def exec_command(
    script: Sequence[str], nproc: int, environ: Mapping[str, str] | None = None
) -> tuple[list[str], dict[str, str]]:
    """torchrun's command line for ``script`` (``["train.py", *args]`` or
    ``["-m", "pkg.train", *args]``) on ``nproc`` ranks, and its environment.

    The script is checked first: a missing one is one error here, not a traceback from each
    rank and from torchrun. The ranks start with the working directory first on their path
    (``-m``); this autotune's folder goes on it too, so that a directory named autotune there
    (a clone, seen from the folder that holds it) cannot shadow it.

    Raises:
        ScriptError: the script or module cannot be found.
    """
    ScriptTarget.from_command(script)
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    command = [*torchrun, "--nproc_per_node", str(nproc), "-m", "autotune.deepspeed", *script]
    env = dict(os.environ if environ is None else environ)
    root = own_import_root()
    if root is not None:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [env.get("PYTHONPATH"), root]))
    return command, env
