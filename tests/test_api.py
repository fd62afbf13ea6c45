"""``autotune.api.tune``: what ``autotune run`` does, called from Python; errors are raised."""

from __future__ import annotations

import contextlib
import json
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

import autotune.job
from autotune.api import RunRequest, load_job, make_job, started_runner, tune
from autotune.config import ConfigError
from autotune.job import TuningJob
from autotune.run_options import RunOptions
from autotune.script_target import ScriptError
from autotune.workloads import WorkloadError

TINY = {"n_layer": 1, "d_model": 16, "n_head": 2, "seq_len": 8, "vocab": 64}
CONFIG = {
    "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
    "train_micro_batch_size_per_gpu": 1,
    "zero_optimization": {"stage": 1},
    "autotuning": {
        "start_profile_step": 1,
        "end_profile_step": 2,
        "tuner_type": "gridsearch",
        "num_remeasure": 0,
        "timeout_s": 90,
    },
}


@pytest.mark.slow
@pytest.mark.multirank
def test_tune_runs_on_its_own_runner_and_returns_the_report(tmp_path: Path) -> None:
    results = tmp_path / "results"
    report = tune(
        CONFIG,
        workload_args=TINY,
        device_memory="1GiB",
        runner="local",
        metric="latency",  # an autotuning key, over the config's
        results_dir=str(results),
    )
    assert report.results_dir == results and report.summary.best is not None
    assert report.num_run_now == 1 and report.optimal_config_path is not None
    assert json.loads((results / "summary.json").read_text())["metric"] == "latency"


def test_bad_input_raises_before_anything_runs(tmp_path: Path) -> None:
    results = str(tmp_path / "results")
    with pytest.raises(ConfigError, match=r"^autotuning\.time_budget_s: input should be"):
        tune(CONFIG, time_budget_s=-5, results_dir=results, runner="local")
    with pytest.raises(ConfigError, match=r"^device_memory: expected a size"):
        tune(CONFIG, device_memory="lots", results_dir=results, runner="local")
    with pytest.raises(ScriptError, match=r"script mode needs a config: pass config=\.\.\."):
        tune(script=[__file__], results_dir=results, runner="local")
    assert not Path(results).exists()


def test_a_config_file_is_named_in_its_errors_and_a_named_override_by_its_name(
    tmp_path: Path,
) -> None:
    path = tmp_path / "bad.json"
    path.write_text('{"zero_optimization": {"stagee": 1}}')
    with pytest.raises(ConfigError, match=rf"^{path}: zero_optimization\.stagee"):
        make_job(RunRequest(RunOptions(config=path)))
    path.write_text("{}")
    late = RunOptions(config=path, start_profile_step=5, end_profile_step=4)
    named = RunRequest(late, names={"end_profile_step": "--end-profile-step"})
    with pytest.raises(ConfigError, match=r"^--end-profile-step 4: autotuning\.end_profile_step"):
        make_job(named)


class StandInRunner:
    """A runner's context manager that records its start and close; ``as_starting`` runs as
    it starts (in the caller's thread, as a Ray start would)."""

    def __init__(self, as_starting: object = None) -> None:
        self.events: list[str] = []
        self.as_starting = as_starting

    @contextlib.contextmanager
    def __call__(self) -> Iterator[str]:
        if callable(self.as_starting):
            self.as_starting()
        self.events.append("started")
        try:
            yield "runner"
        finally:
            self.events.append("closed")


def test_loading_a_job_with_workload_arguments_leaves_torch_to_the_check(tmp_path: Path) -> None:
    # ``-a key=value`` is parsed before Ray starts; torch (a second) loads in the check that
    # overlaps it. A fresh interpreter: this one imported torch long ago.
    probe = (
        "import json, sys\n"
        "from autotune.api import RunRequest, load_job\n"
        "from autotune.run_options import RunOptions\n"
        f"options = RunOptions(config={{}}, workload_args=['n_layer=2', 'vocab=64'],"
        f" results_dir={str(tmp_path / 'r')!r})\n"
        "job = load_job(RunRequest(options))\n"
        "print(json.dumps([dict(job.workload_args), 'torch' in sys.modules]))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == [{"n_layer": 2, "vocab": 64}, False]


def a_job(tmp_path: Path) -> TuningJob:
    return load_job(RunRequest(RunOptions(config=CONFIG, results_dir=str(tmp_path / "r"))))


def test_the_job_is_checked_while_the_runner_starts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    checked = threading.Event()
    monkeypatch.setattr(autotune.job, "check_job", lambda job: checked.set())
    # The runner's start waits for the check: done one after the other, it would wait forever.
    start = StandInRunner(as_starting=lambda: checked.wait(timeout=120) or pytest.fail("waited"))
    with started_runner(a_job(tmp_path), start) as runner:
        assert runner == "runner" and checked.is_set()
    assert start.events == ["started", "closed"]


def test_a_failed_check_shuts_the_runner_down_and_raises_its_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def bad_workload(job: TuningJob) -> None:
        raise WorkloadError("workload 'nope': cannot import module 'nope'")

    monkeypatch.setattr(autotune.job, "check_job", bad_workload)
    start = StandInRunner()
    failed = pytest.raises(WorkloadError, match="cannot import module 'nope'")
    with failed, started_runner(a_job(tmp_path), start):
        pytest.fail("the run went on after a failed check")
    assert start.events == ["started", "closed"]


def test_ctrl_c_while_the_runner_starts_takes_effect_once_it_has(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A KeyboardInterrupt raised inside one of the start's imports could leave the import
    # lock held with the check's thread still importing: it waits for the start to finish.
    checked: list[TuningJob] = []
    monkeypatch.setattr(autotune.job, "check_job", checked.append)
    start = StandInRunner(as_starting=lambda: signal.raise_signal(signal.SIGINT))
    with pytest.raises(KeyboardInterrupt), started_runner(a_job(tmp_path), start):
        pytest.fail("the run went on after Ctrl-C")
    assert start.events == ["started", "closed"] and len(checked) == 1
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
