"""What the tests of client scripts share (the HF Trainer, Accelerate, TRL and Lightning
scripts under ``tests/hf`` and ``tests/lightning``): tuning one with ``autotune run -- ...``,
reading what it printed, and training with ``autotune exec`` as a user would."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from typer.testing import CliRunner

from autotune.cli import app

cli = CliRunner()


def write(path: Path, config: dict[str, Any]) -> Path:
    path.write_text(json.dumps(config, indent=2))
    return path


def tune(results: Path, *command: str, flags: Sequence[str] = ()) -> dict[str, Any]:
    """``autotune run --results-dir RESULTS -q [FLAGS] -- COMMAND``; the run's summary."""
    run = ["run", "--results-dir", str(results), "-q", *flags, "--", *command]
    outcome = cli.invoke(app, run)
    assert outcome.exit_code == 0, outcome.output
    return json.loads((results / "summary.json").read_text())


def micro_batch_used(results: Path, name: str, rank: int) -> int:
    """The micro-batch the script's model was fed, as the script printed it."""
    return printed_number(results, name, rank, "micro-batch used")


def client_stage(results: Path, name: str, rank: int) -> int:
    """The ZeRO stage the script's client (its Accelerate) configured, as the script printed it."""
    return printed_number(results, name, rank, "client stage")


def printed_number(results: Path, name: str, rank: int, label: str) -> int:
    """``LABEL: N`` from an experiment's rank output."""
    output = (results / "exps" / name / f"rank{rank}.out").read_text()
    match = re.search(rf"{label}: (\d+)", output)
    assert match, f"{name} rank {rank} printed no {label}: {output[-500:]!r}"
    return int(match.group(1))


def autotune_exec(*script: str | Path, timeout_s: float = 300) -> subprocess.CompletedProcess[str]:
    """``autotune exec --nproc 2 -- SCRIPT ARGS``, as a user trains with a tuned config."""
    command = [sys.executable, "-m", "autotune", "exec", "--nproc", "2", "--", *map(str, script)]
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout_s, check=False)


def best_command(results: Path) -> list[str]:
    """The training command ``autotune best --command`` prints, as arguments."""
    printed = cli.invoke(app, ["best", str(results), "--command"])
    assert printed.exit_code == 0, printed.output
    assert printed.stdout.strip() in (results / "summary.txt").read_text()
    return shlex.split(printed.stdout)


def train_with_best(results: Path) -> subprocess.CompletedProcess[str]:
    """Run the printed command (``autotune exec --nproc N -- SCRIPT ARGS``) as printed."""
    command = best_command(results)
    assert command[:2] == ["autotune", "exec"], command
    launched = [sys.executable, "-m", "autotune", *command[1:]]
    return subprocess.run(launched, capture_output=True, text=True, timeout=300, check=False)


def first_losses(output: str, count: int = 10) -> list[float]:
    losses = [float(x) for x in re.findall(r"loss at step \d+: ([-\d.e]+)", output)]
    assert len(losses) >= count, output[-2000:]
    return losses[:count]
