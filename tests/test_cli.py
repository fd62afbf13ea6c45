"""``autotune validate`` through Typer's runner and as a real process."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from typer.testing import CliRunner

from autotune.cli import app

runner = CliRunner()


def test_validate_prints_the_resolved_config(tmp_path: Path) -> None:
    path = tmp_path / "c.json"
    path.write_text(json.dumps({"train_batch_size": 32, "gradient_accumulation_steps": 2}))
    result = runner.invoke(app, ["validate", str(path), "--world-size", "2"])
    assert result.exit_code == 0, result.output
    printed = json.loads(result.stdout)
    assert printed["train_micro_batch_size_per_gpu"] == 8


def test_validate_full_shows_defaults(tmp_path: Path) -> None:
    path = tmp_path / "c.json"
    path.write_text("{}")
    result = runner.invoke(app, ["validate", str(path), "--full"])
    assert result.exit_code == 0
    assert json.loads(result.stdout)["autotuning"]["tuner_early_stopping"] == 5


def test_validate_bad_config_exits_2_with_one_line_and_no_traceback(tmp_path: Path) -> None:
    path = tmp_path / "c.json"
    path.write_text('{"zero_optimization": {"stage": 7}}')
    proc = subprocess.run(
        [sys.executable, "-m", "autotune", "validate", str(path)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        f"error: {path}: zero_optimization.stage: input should be less than or equal to 3 (got 7)"
    ]
    assert "Traceback" not in proc.stderr


def test_validate_missing_file_exits_2(tmp_path: Path) -> None:
    result = runner.invoke(app, ["validate", str(tmp_path / "missing.json")])
    assert result.exit_code == 2
    assert "config file not found" in result.stderr
