"""Script mode end to end: ``autotune run -- ds_script.py --deepspeed ds_config.json ...``
tunes a DeepSpeed-style script at world size 2, on warm Ray actors and on fresh processes."""

from __future__ import annotations

import json
import re
import signal
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from autotune.cli import app
from autotune.results import ResultsDir, load_results
from tests.cli_process import finished_names, start_autotune, wait_for_finished
from tests.deepspeed_installed import needs_deepspeed

pytestmark = pytest.mark.multirank
SCRIPT = Path(__file__).with_name("ds_script.py")
cli = CliRunner()


def write_config(tmp_path: Path, **autotuning: Any) -> Path:
    config = {
        "train_micro_batch_size_per_gpu": "auto",
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
        "zero_optimization": {"stage": [1, 2]},
        "autotuning": {
            "enabled": True,
            # The stray space is real: DeepSpeed's own examples carry it.
            "arg_mappings": {"train_micro_batch_size_per_gpu ": "--per_device_train_batch_size"},
            "max_train_micro_batch_size_per_gpu": 8,
            "start_profile_step": 2,
            "end_profile_step": 3,
            "tuner_type": "gridsearch",
            "num_remeasure": 0,
            **autotuning,
        },
    }
    path = tmp_path / "ds_config.json"
    path.write_text(json.dumps(config))
    return path


def loader_batch(results: Path, name: str, rank: int) -> int:
    """The batch the script's own DataLoader produced, as the script printed it."""
    output = (results / "exps" / name / f"rank{rank}.out").read_text()
    match = re.search(r"loader_batch=(\d+)", output)
    assert match, f"{name} rank {rank} printed no batch: {output!r}"
    return int(match.group(1))


@pytest.mark.ray
@pytest.mark.slow
def test_ray_tunes_the_script_and_records_its_failures(ray_cluster: str, tmp_path: Path) -> None:
    # The hang is cut at the timeout: short, but ample for this tiny script on a busy machine
    # (a new gang's start-up, after the hang, does not count against it).
    config, results = write_config(tmp_path, timeout_s=10), tmp_path / "results"
    faults = "z2_8=early,z2_4=raise,z2_2=hang"
    args = ["run", "--results-dir", str(results), "-q", "--", str(SCRIPT)]
    args += ["--deepspeed", str(config), "--per_device_train_batch_size", "3", "--faults", faults]
    outcome = cli.invoke(app, args)
    assert outcome.exit_code == 0, outcome.output

    frame = load_results(results).set_index("name")
    statuses = frame["status"].to_dict()
    assert statuses["z2_mbs8"] == "error"
    assert "finished after 1 optimizer steps" in frame.loc["z2_mbs8", "error"]
    assert statuses["z2_mbs4"] == "error"
    assert frame.loc["z2_mbs4", "error"] == "RuntimeError: injected failure in the training loop"
    assert "injected failure" in (results / "exps" / "z2_mbs4" / "rank1.err").read_text()
    assert statuses["z2_mbs2"] == "timeout"
    ok = frame[frame["status"] == "ok"]
    assert len(ok) >= 3, statuses
    for name, row in ok.iterrows():
        # The script's loader ran at the micro-batch the experiment recorded (arg_mappings).
        assert loader_batch(results, str(name), 0) == row["micro_batch_size"]
        assert loader_batch(results, str(name), 1) == row["micro_batch_size"]
        assert row["flops"] > 0 and row["peak_memory_bytes"] > 0
    first_ok = results / "exps" / str(ok.index[0]) / "metrics.json"
    assert json.loads(first_ok.read_text())["metrics"]["num_params"] == 16 * 64 + 64 + 64 + 1
    optimal = json.loads((results / "ds_config_optimal.json").read_text())
    assert optimal["train_micro_batch_size_per_gpu"] in set(ok["micro_batch_size"])
    assert (results / "summary.txt").read_text().startswith("autotune: ds_script.py at")
    report = cli.invoke(app, ["report", str(results)])
    assert report.exit_code == 0 and all(str(name) in report.stdout for name in frame.index)
    best = cli.invoke(app, ["best", str(results)])
    assert best.exit_code == 0 and best.stdout.strip().endswith("ds_config_optimal.json")


@pytest.mark.parametrize("engine", ["builtin", pytest.param("deepspeed", marks=needs_deepspeed)])
@pytest.mark.slow
def test_kill_9_mid_run_then_the_same_command_loses_nothing(tmp_path: Path, engine: str) -> None:
    config = write_config(
        tmp_path, start_profile_step=1, end_profile_step=2, timeout_s=90, engine=engine
    )
    spec = json.loads(config.read_text())
    spec["train_micro_batch_size_per_gpu"] = [2, 4]
    spec["zero_optimization"]["stage"] = 1
    config.write_text(json.dumps(spec))
    results = tmp_path / "results"
    command = ["run", "--runner", "local", "--results-dir", str(results), "-q", "--"]
    command += [str(SCRIPT), "--deepspeed", str(config), "--init", "engine"]

    driver = start_autotune(*command)
    wait_for_finished(results, 1)
    driver.send_signal(signal.SIGKILL)
    driver.wait(timeout=30)
    finished_before = finished_names(results)

    resumed = start_autotune(*command)
    _, err = resumed.communicate(timeout=300)
    assert resumed.returncode == 0, err
    records = ResultsDir(results).records()
    names = [record["name"] for record in records]
    assert len(names) == len(set(names)), "an experiment ran twice"
    assert names[: len(finished_before)] == finished_before
    assert set(names) == {"z1_mbs2", "z1_mbs4"}
    assert all(record["status"] == "ok" for record in records), records
    for record in records:
        assert (
            loader_batch(results, record["name"], 0)
            == (record["ds_config"]["train_micro_batch_size_per_gpu"])
        )


def test_the_cifar_shaped_script_keeps_its_own_config_under_the_experiments(
    tmp_path: Path,
) -> None:
    """DeepSpeedExamples' cifar builds its config as a dict in the script (Adam, WarmupLR,
    clipping, ``--dtype bf16``) and is launched with a bare ``--deepspeed``. Tuned with a
    config shaped like their ``ds_config_tune.json``, each experiment trains the script's
    optimizer and precision at the tuner's micro-batch and stage, not a bare config."""
    config = {
        "train_micro_batch_size_per_gpu": "auto",
        "zero_optimization": {"stage": 1},
        "autotuning": {
            "enabled": True,
            "overwrite": False,
            # The script builds its config in code, the stage from its own flag: the
            # experiment's stage must reach that flag for the script to ask for it.
            "arg_mappings": {"zero_optimization.stage": "--stage"},
            "fast": True,
            "max_train_micro_batch_size_per_gpu": 4,
            "start_profile_step": 1,
            "end_profile_step": 2,
            "num_remeasure": 0,
        },
    }
    path = tmp_path / "ds_config_tune.json"
    path.write_text(json.dumps(config))
    results = tmp_path / "results"
    script = Path(__file__).parents[1] / "engine" / "cifar_script.py"
    command = ["run", "-c", str(path), "--runner", "local", "--num-trials", "1"]
    command += ["--results-dir", str(results), "-q", "--", str(script), "--deepspeed"]
    done = cli.invoke(app, [*command, "--dtype", "bf16"])
    assert done.exit_code == 0, done.output
    records = ResultsDir(results).records()
    assert [record["status"] for record in records] == ["ok"], records
    output = (results / "exps" / records[0]["name"] / "rank0.out").read_text()
    assert "kept from the script's own config: bf16, fp16, gradient_clipping, optimizer" in output
    micro = records[0]["ds_config"]["train_micro_batch_size_per_gpu"]
    assert f"dtype=torch.bfloat16 stage=1 micro_batch={micro}" in output, output


def test_a_script_that_exits_says_why_in_its_error(tmp_path: Path) -> None:
    from autotune.runner.script import _last_stderr_line

    (tmp_path / "rank1.err").write_text("usage: train.py [-h]\ntrain.py: error: bad flag\n\n")
    assert _last_stderr_line(str(tmp_path), 1) == "train.py: error: bad flag"
    assert _last_stderr_line(str(tmp_path), 0) == ""


def test_a_client_that_built_its_engine_otherwise_is_named() -> None:
    from autotune.runner.script import client_mismatch

    experiment = {"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 1,
                  "zero_optimization": {"stage": 3}}  # fmt: skip
    stage2 = {**experiment, "zero_optimization": {"stage": 2}}
    said = client_mismatch(stage2, experiment, experiment)
    assert said == "ZeRO stage 2 (zero_optimization.stage), where the experiment runs 3"
    bigger = {**experiment, "train_micro_batch_size_per_gpu": 8}
    assert "micro-batch 8" in str(client_mismatch(bigger, experiment, experiment))
    assert client_mismatch(experiment, experiment, experiment) is None
    # What the experiment's file leaves at "auto" is the client's to fill.
    read = {**experiment, "gradient_accumulation_steps": "auto"}
    filled = {**experiment, "gradient_accumulation_steps": 4}
    assert client_mismatch(filled, read, experiment) is None
    assert client_mismatch({"optimizer": {}}, experiment, experiment) is None


def test_a_micro_batch_over_a_ranks_share_of_accelerates_data_is_seen() -> None:
    pytest.importorskip("accelerate")
    from accelerate.data_loader import DataLoaderShard
    from accelerate.state import GradientState

    from autotune.deepspeed.stand_in import reset_accelerate
    from autotune.runner.script import rank_share_of_data

    assert rank_share_of_data(2) is None  # no Accelerate loader: nothing known
    loader = DataLoaderShard(list(range(401)), batch_size=1024)
    try:
        GradientState()._add_dataloader(loader)
        assert rank_share_of_data(2) == (401, 201)
    finally:
        reset_accelerate()
