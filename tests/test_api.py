"""``autotune.api.tune``: what ``autotune run`` does, called from Python; errors are raised."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from autotune.api import RunRequest, make_job, tune
from autotune.config import ConfigError
from autotune.script_target import ScriptError

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
        make_job(RunRequest(config=path))
    path.write_text("{}")
    named = RunRequest(path, {"seed": "x"}, names={"seed": "--seed"})
    with pytest.raises(ConfigError, match=r"^--seed x: autotuning\.seed"):
        make_job(named)
