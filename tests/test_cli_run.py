"""``autotune run / report / best`` as a user runs them: results, resume, bad input."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import optuna
import pytest
from optuna.storages import JournalStorage
from optuna.storages.journal import JournalFileBackend
from optuna.trial import TrialState
from typer.testing import CliRunner

from autotune.cli import app
from autotune.results import DirectoryLock, ResultsDir, load_results
from tests.cli_process import (
    finished_names,
    processes_with_env,
    start_autotune,
    wait_for_finished,
    wait_until,
)

pytestmark = pytest.mark.multirank
runner = CliRunner()
TINY = [
    "-a",
    "n_layer=1",
    "-a",
    "d_model=32",
    "-a",
    "n_head=2",
    "-a",
    "seq_len=16",
    "-a",
    "vocab=64",
]


def write_config(tmp_path: Path, **autotuning: Any) -> Path:
    config = {
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
        "train_micro_batch_size_per_gpu": [1, 2],
        "zero_optimization": {"stage": [1, 2]},
        "autotuning": {
            "start_profile_step": 1,
            "end_profile_step": 2,
            "tuner_type": "gridsearch",
            "num_remeasure": 0,
            "timeout_s": 90,
            **autotuning,
        },
    }
    path = tmp_path / "ds_config.json"
    path.write_text(json.dumps(config))
    return path


def run_args(config: Path, results: Path, *extra: str) -> list[str]:
    return [
        "run",
        "-c",
        str(config),
        "--results-dir",
        str(results),
        "--runner",
        "local",
        "--device-memory",
        "1GiB",
        "-q",
        *TINY,
        *extra,
    ]


@pytest.mark.slow
def test_run_report_best_and_resume(tmp_path: Path) -> None:
    config, results = write_config(tmp_path), tmp_path / "results-in-a-folder-named-at-length"
    first = runner.invoke(app, run_args(config, results))
    assert first.exit_code == 0, first.output
    # Off a terminal no line is broken, however long (docs/cli.md).
    header = f"autotune: tuning gpt at world size 2 by throughput; results in {results}"
    assert len(header) > 80 and first.stdout.splitlines()[0] == header
    assert "optimal config:" in first.stdout
    frame = load_results(results)
    assert set(frame["status"]) == {"ok"} and len(frame) >= 4
    assert {1, 2} == set(frame["zero_stage"]) and {1, 2} == set(frame["micro_batch_size"])
    optimal = json.loads((results / "ds_config_optimal.json").read_text())
    assert "autotuning" not in optimal and optimal["optimizer"]["type"] == "AdamW"
    assert optimal["train_batch_size"] == 2 * optimal["train_micro_batch_size_per_gpu"]
    summary_text = (results / "summary.txt").read_text()
    assert summary_text.startswith("autotune: gpt at world size 2")
    assert re.search(r"best: \S+  throughput [0-9.]+ samples/s", summary_text)

    assert_the_study_is_the_record(results, len(frame))

    again = runner.invoke(app, run_args(config, results))
    assert again.exit_code == 0, again.output
    assert f"{len(frame)} from earlier runs)" in again.stdout
    assert "no experiment ran ok" not in again.stdout
    assert len(load_results(results)) == len(frame)

    best = runner.invoke(app, ["best", str(results)])
    assert best.exit_code == 0 and best.stdout.strip() == str(results / "ds_config_optimal.json")
    csv = runner.invoke(app, ["report", str(results), "--format", "csv"])
    assert csv.exit_code == 0 and csv.stdout.startswith("name,status,zero_stage")
    table = runner.invoke(app, ["report", str(results)])
    assert table.exit_code == 0 and all(name in table.stdout for name in frame["name"])


@pytest.mark.slow
def test_kill_9_mid_run_loses_nothing_and_resume_finishes(tmp_path: Path) -> None:
    config, results = write_config(tmp_path), tmp_path / "results"
    driver = start_autotune(*run_args(config, results))
    wait_for_finished(results, 1)
    driver.send_signal(signal.SIGKILL)
    driver.wait(timeout=30)
    finished_before = finished_names(results)

    resumed = start_autotune(*run_args(config, results))
    _, err = resumed.communicate(timeout=300)
    assert resumed.returncode == 0, err
    names = finished_names(results)
    assert len(names) == len(set(names)), "an experiment ran twice"
    assert names[: len(finished_before)] == finished_before
    study = ResultsDir(results).run_study.load()
    assert study is not None
    # One trial per experiment, each finished; the one the kill cut off is failed, and the
    # trial that ran it again says it supersedes it; a trial the kill caught between its
    # creation and its naming (no configuration yet) is failed.
    superseded = {t.user_attrs.get("supersedes") for t in study.trials}
    named = [t for t in study.trials if "name" in t.user_attrs and t.number not in superseded]
    assert len(named) == len(names) and all(t.state.is_finished() for t in study.trials)
    left = [t for t in study.trials if t not in named]
    assert all(t.number in superseded or "name" not in t.user_attrs for t in left)
    assert all(t.state is TrialState.FAIL for t in left) and len(left) <= 1
    # What an uninterrupted run measures: the whole grid (no early stop, no re-measuring).
    assert set(names) == {f"z{stage}_mbs{size}" for stage in (1, 2) for size in (1, 2)}


@pytest.mark.slow
def test_storage_puts_the_study_in_a_database_plain_optuna_opens(tmp_path: Path) -> None:
    config, results = write_config(tmp_path, tuner_num_trials=1), tmp_path / "results"
    url = f"sqlite:///{tmp_path / 'autotune.db'}"
    done = runner.invoke(app, run_args(config, results, "--storage", url))
    assert done.exit_code == 0, done.output
    assert not (results / "study.journal").exists()
    (name,) = optuna.get_all_study_names(url)
    (trial,) = optuna.load_study(study_name=name, storage=url).trials
    assert trial.state is TrialState.COMPLETE and trial.params["zero_stage"] in (1, 2)
    assert list(load_results(results)["name"]) == [trial.user_attrs["name"]]


def assert_the_study_is_the_record(results: Path, num_experiments: int) -> None:
    """Plain Optuna opens the run's journal: one study, a trial per experiment with its stage
    and micro-batch, and each configuration the report ranks is bracketed by its trials'
    values (losers stopped early are PRUNED with the value of their first steps)."""
    storage = JournalStorage(JournalFileBackend(str(results / "study.journal")))
    (name,) = optuna.get_all_study_names(storage)
    study = optuna.load_study(study_name=name, storage=storage)
    assert len(study.trials) == num_experiments
    assert all({"zero_stage", "micro_batch_size"} <= set(t.params) for t in study.trials)
    report = runner.invoke(app, ["report", str(results), "--format", "json"])
    for row in json.loads(report.stdout):
        if row["status"] != "ok":
            continue
        values = [
            t.value
            for t in study.trials
            if t.state in (TrialState.COMPLETE, TrialState.PRUNED)
            and t.params["zero_stage"] == row["zero_stage"]
            and t.params["micro_batch_size"] == row["micro_batch_size"]
            and t.value is not None
        ]
        low, high = min(values, default=0.0), max(values, default=0.0)
        assert low * (1 - 1e-9) <= row["throughput"] <= high * (1 + 1e-9), (row, values)


@pytest.mark.slow
def test_ctrl_c_stops_cleanly_with_exit_130(tmp_path: Path) -> None:
    config, results = write_config(tmp_path), tmp_path / "results"
    driver = start_autotune(*run_args(config, results))
    wait_for_finished(results, 1)
    driver.send_signal(signal.SIGINT)
    _, err = driver.communicate(timeout=60)
    assert driver.returncode == 130
    assert "run the same command to resume" in err and "Traceback" not in err
    with DirectoryLock(results):  # released: the next run can take the directory
        pass
    assert len(load_results(results)) >= 1


BAD_INPUT = {
    "missing config": (["-c", "/nonexistent/ds.json"], "config file not found"),
    "metric": (["--metric", "speed"], "--metric speed: 'speed' is not one of"),
    "world size": (["--world-size", "0"], "--world-size 0: input should be greater than or equal"),
    "workload module": (["--workload", "no_such_module_xyz:build"], "no_such_module_xyz"),
    "workload": (["--workload", "nonsense"], "nonsense"),
    "size": (["--device-memory", "lots"], "--device-memory"),
    "size in two words": (["--device-memory", "16", "GB"], "--device-memory 16 GB: a size is one"),
    "workload arg": (["--workload-arg", "novalue"], "expected key=value"),
    "budget": (["--time-budget", "0"], "--time-budget 0.0: input should be greater than 0"),
}
# Every case through the console entry point in one interpreter: as a user's process sees
# them (main() and its warning hook included), without an interpreter start per case.
BAD_INPUT_PROBE = """
import contextlib, io, json, sys
from autotune.cli import main
seen = {}
for case, args in json.loads(sys.argv[1]).items():
    sys.argv, stderr = ["autotune", *args], io.StringIO()
    with contextlib.redirect_stderr(stderr):
        try:
            main()
            code = 0
        except SystemExit as exit_:
            code = exit_.code
        except BaseException as err:
            code = repr(err)
    seen[case] = [code, stderr.getvalue()]
print(json.dumps(seen))
"""


@pytest.fixture(scope="module")
def bad_input_seen(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[Any]]:
    results = str(tmp_path_factory.mktemp("bad") / "r")
    cases = {
        case: ["run", "--results-dir", results, "--runner", "local", *args]
        for case, (args, _) in BAD_INPUT.items()
    }
    done = subprocess.run(
        [sys.executable, "-c", BAD_INPUT_PROBE, json.dumps(cases)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return dict(json.loads(done.stdout))


@pytest.mark.parametrize("case", list(BAD_INPUT))
def test_bad_input_exits_2_with_one_line(bad_input_seen: dict[str, list[Any]], case: str) -> None:
    code, stderr = bad_input_seen[case]
    assert code == 2, stderr
    [line] = stderr.splitlines()
    assert line.startswith("error: ") and BAD_INPUT[case][1] in line


@pytest.mark.parametrize(
    "problem", ["config key", "config file", "results dir is a file", "workload package"]
)
def test_a_bad_input_is_refused_before_ray_starts(tmp_path: Path, problem: str) -> None:
    """The error comes alone on stderr, before anything starts Ray (it takes seconds) or
    builds the workload."""
    results = tmp_path / "r"
    args = ["run", "--results-dir", str(results)]
    if problem == "config key":
        args += ["--time-budget", "0"]
    elif problem == "config file":
        (tmp_path / "bad.json").write_text("{not json")
        args += ["-c", str(tmp_path / "bad.json")]
    elif problem == "results dir is a file":
        results.write_text("mine")
    else:
        args += ["--workload", "no_such_module_xyz.models:build"]
    probe = (
        "import sys\nfrom autotune.cli import main\n"
        f"sys.argv = ['autotune', *{args!r}]\n"
        "try:\n    main()\nexcept SystemExit as exit_:\n"
        "    print('ray imported:', 'ray' in sys.modules, file=sys.stderr)\n"
        "    print('torch imported:', 'torch' in sys.modules, file=sys.stderr)\n"
        "    raise\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=False
    )
    assert proc.returncode == 2 and proc.stdout == "", proc.stdout
    error, ray, torch = proc.stderr.strip().splitlines()
    assert error.startswith("error: ") and ray == "ray imported: False", proc.stderr
    assert torch == "torch imported: False", proc.stderr  # the workload was never built
    if problem == "results dir is a file":
        assert "is a file, not a directory" in error and results.read_text() == "mine"
    else:
        assert not results.exists()
    if problem == "workload package":
        assert "no_such_module_xyz" in error


@pytest.mark.parametrize("problem", ["workload", "another job in the results dir"])
def test_a_bad_job_found_while_ray_starts_is_one_line_and_leaves_no_ray(
    tmp_path: Path, problem: str
) -> None:
    """The job is checked while Ray starts in the background: the error still comes alone on
    stderr with exit 2, and the Ray it started is shut down, every process of it."""
    results = tmp_path / "results"
    args = ["run", "--results-dir", str(results)]
    if problem == "workload":  # found once it is built: its package is there
        (tmp_path / "broken_workload.py").write_text("def build():\n    raise ValueError('no')\n")
        args += ["--workload", "broken_workload:build"]
    else:  # found once the job's fingerprint is known
        results.mkdir()
        (results / "fingerprint.json").write_text(json.dumps({"tuned": {"workload": "mlp"}}))
        (results / "study.journal").write_text("")
    # Short: Ray puts unix sockets under it, and their paths are limited to ~100 characters.
    ray_dir = tempfile.mkdtemp(prefix="at-ray-", dir="/tmp")
    env = {**os.environ, "RAY_TMPDIR": ray_dir}
    env.pop("RAY_ADDRESS", None)
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "autotune", *args],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
            env=env,
            cwd=tmp_path,
        )
        assert proc.returncode == 2 and proc.stdout == "", proc.stdout
        [error] = proc.stderr.splitlines()
        assert error.startswith("error: ")
        assert os.listdir(ray_dir), "Ray never started: this checks nothing"
        assert wait_until(lambda: not processes_with_env("RAY_TMPDIR", ray_dir))
    finally:
        for pid in processes_with_env("RAY_TMPDIR", ray_dir):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        shutil.rmtree(ray_dir, ignore_errors=True)
    if problem != "workload":
        assert json.loads((results / "fingerprint.json").read_text())["tuned"]["workload"] == "mlp"


def test_unwritable_results_dir_exits_2(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    config = write_config(tmp_path)
    result = runner.invoke(app, run_args(config, blocker / "results"))
    assert result.exit_code == 2
    assert "cannot create results directory" in result.stderr


def test_a_different_job_in_the_same_directory_is_refused(tmp_path: Path) -> None:
    config, results = write_config(tmp_path), tmp_path / "results"
    (results).mkdir()
    (results / "fingerprint.json").write_text(json.dumps({"tuned": {"workload": "mlp"}}))
    (results / "study.journal").write_text("")
    result = runner.invoke(app, run_args(config, results))
    assert result.exit_code == 2 and "different tuning job" in result.stderr


def test_report_of_a_missing_directory_exits_2(tmp_path: Path) -> None:
    result = runner.invoke(app, ["report", str(tmp_path)])
    assert result.exit_code == 2 and "not an autotune results directory" in result.stderr
    assert runner.invoke(app, ["best", str(tmp_path)]).exit_code == 2


@pytest.mark.slow
def test_flags_override_the_config(tmp_path: Path) -> None:
    os.environ.pop("RAY_ADDRESS", None)
    config, results = write_config(tmp_path, metric="throughput"), tmp_path / "results"
    result = runner.invoke(
        app, run_args(config, results, "--metric", "latency", "--num-trials", "2", "--fast")
    )
    assert result.exit_code == 0, result.output
    summary = json.loads((results / "summary.json").read_text())
    assert summary["metric"] == "latency" and summary["num_run"] == 2


def test_a_time_budget_already_spent_runs_nothing_and_says_why(tmp_path: Path) -> None:
    config, results = write_config(tmp_path), tmp_path / "results"
    result = runner.invoke(app, run_args(config, results, "--time-budget", "0.001"))
    assert result.exit_code == 1, result.output
    assert "time budget of 0.001 s spent" in result.output
    assert json.loads((results / "summary.json").read_text())["num_run"] == 0
