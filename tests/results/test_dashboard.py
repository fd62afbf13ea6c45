"""optuna-dashboard serves a run's study from its results directory, as the docs say."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from autotune.experiment import Status
from autotune.results import ResultsDir
from autotune.runner import free_port
from tests.results.records import FINGERPRINT, commit, make_result, make_spec


def get_json(url: str, timeout_s: float = 60) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with urllib.request.urlopen(url, timeout=5) as response:
                return json.loads(response.read())
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def test_optuna_dashboard_serves_the_runs_study_journal(tmp_path: Path) -> None:
    pytest.importorskip("optuna_dashboard")
    with ResultsDir.open(tmp_path / "run", FINGERPRINT) as results:
        commit(results, make_spec("z1_mbs4"), make_result("z1_mbs4", throughput=12.0))
        commit(results, make_spec("z2_mbs8", 2, 8), make_result("z2_mbs8", Status.oom))
    command = shutil.which("optuna-dashboard") or "optuna-dashboard"
    if not Path(command).exists():  # the venv's, beside this python
        command = str(Path(sys.executable).with_name("optuna-dashboard"))
    port = free_port()
    journal = tmp_path / "run" / "study.journal"
    server = subprocess.Popen(
        [command, str(journal), "--host", "127.0.0.1", "--port", str(port), "--quiet"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        base = f"http://127.0.0.1:{port}/api"
        (study,) = get_json(f"{base}/studies")["study_summaries"]
        assert study["study_name"].startswith("run-throughput-")
        detail = get_json(f"{base}/studies/{study['study_id']}?after=0")
        trials = {
            attr["value"]: trial
            for trial in detail["trials"]
            for attr in trial["user_attrs"]
            if attr["key"] == "name"
        }
        assert set(trials) == {"z1_mbs4", "z2_mbs8"}
        assert trials["z1_mbs4"]["state"] == "Complete" and trials["z2_mbs8"]["state"] == "Fail"
        assert trials["z1_mbs4"]["values"] == [pytest.approx(12.0)]
    finally:
        server.terminate()
        server.wait(timeout=10)
