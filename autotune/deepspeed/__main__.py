"""``python -m autotune.deepspeed SCRIPT [ARGS...]`` (or ``-m MODULE [ARGS...]``): run a training
script with autotune standing in for DeepSpeed, unchanged: ``import deepspeed``, transformers'
``Trainer(args=TrainingArguments(deepspeed=...))`` and Accelerate's ``DeepSpeedPlugin`` all
train on the built-in engine. torchrun starts it as it would the script::

    torchrun --nproc_per_node 2 -m autotune.deepspeed train.py --deepspeed ds_config.json

(``autotune exec --nproc 2 -- train.py ...`` is that command.) Only this process is affected:
elsewhere ``import deepspeed`` finds whatever is installed.
"""

from __future__ import annotations

import os
import runpy
import sys

from autotune.deepspeed.stand_in import install

USAGE = "usage: python -m autotune.deepspeed SCRIPT [ARGS...] | -m MODULE [ARGS...]"


def main(argv: list[str]) -> None:
    if not argv or (argv[0] == "-m" and len(argv) < 2):
        sys.exit(USAGE)
    install()
    if argv[0] == "-m":
        sys.argv = [argv[1], *argv[2:]]
        runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
    else:
        sys.argv = list(argv)
        # As ``python SCRIPT`` does: the script's folder first on the import path (for
        # ``python -m`` Python put the working directory there).
        sys.path[0] = os.path.dirname(os.path.abspath(argv[0]))
        runpy.run_path(argv[0], run_name="__main__")


if __name__ == "__main__":
    main(sys.argv[1:])
