"""``experiments/gpu_check.sh``: its dry run works without a GPU, and a failed step fails it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "experiments" / "gpu_check.sh"


@pytest.mark.skipif(torch.cuda.is_available(), reason="the dry run's skip checks need no CUDA")
@pytest.mark.slow
def test_the_dry_run_checks_every_step_without_a_gpu(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHON": sys.executable}
    env.pop("OUT", None)
    done = subprocess.run(
        ["bash", str(SCRIPT), "--dry-run", str(tmp_path)],
        capture_output=True,
        text=True,
        env=env,
        timeout=280,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    report = (tmp_path / "report.md").read_text()
    for name in ("environment", "gpu-tests", "tuning", "benchmark"):
        assert f"| {name} | ok |" in report, report
    assert "FAILED" not in report
    # Collected and skipped, none an error.
    summary = (tmp_path / "pytest.log").read_text().strip().splitlines()[-1]
    assert " skipped" in summary and "error" not in summary and "passed" not in summary
    assert "optimal config:" in (tmp_path / "tuning.log").read_text()


def test_a_failed_step_fails_the_report(tmp_path: Path) -> None:
    steps = tmp_path / "steps.tsv"
    steps.write_text("environment\tok\t1\tenvironment.log\ngpu-tests\tFAILED (exit 1)\t9\tp.log\n")
    report = [sys.executable, str(REPO / "experiments" / "gpu_report.py")]
    done = subprocess.run(
        [
            *report,
            "--steps",
            str(steps),
            "--measurements",
            str(tmp_path),
            "--output",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 1 and "failed: ['gpu-tests']" in done.stdout
    assert "| gpu-tests | FAILED (exit 1) | 9 | p.log |" in (tmp_path / "report.md").read_text()


def test_an_unknown_option_exits_2() -> None:
    done = subprocess.run(["bash", str(SCRIPT), "--bogus"], capture_output=True, text=True)
    assert done.returncode == 2 and "unknown option --bogus" in done.stderr
