"""The torch-free description of a user's script: argv rewriting by arg_mappings, the config
path, the fingerprint."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from autotune.config import load_config
from autotune.experiment import ExperimentResult, ExperimentSpec, Metrics, Status
from autotune.script import ScriptError, ScriptTarget
from autotune.tuning import TuningJob, tune

MAPPINGS = {"train_micro_batch_size_per_gpu": "--per_device_train_batch_size"}


def target(tmp_path: Path, *args: str, mappings: dict[str, str] | None = None) -> ScriptTarget:
    script = tmp_path / "train.py"
    script.write_text("print('hi')\n")
    return ScriptTarget.from_command(
        [str(script), *args], MAPPINGS if mappings is None else mappings
    )


def test_arg_mappings_rewrite_replace_or_append_the_flag(tmp_path: Path) -> None:
    config = {"train_micro_batch_size_per_gpu": 8, "zero_optimization": {"stage": 2}}
    spaced = target(tmp_path, "--per_device_train_batch_size", "3", "--x", "1")
    assert spaced.argv(config)[1:] == ["--per_device_train_batch_size", "8", "--x", "1"]
    joined = target(tmp_path, "--per_device_train_batch_size=3")
    assert joined.argv(config)[1:] == ["--per_device_train_batch_size=8"]
    assert target(tmp_path).argv(config)[1:] == ["--per_device_train_batch_size", "8"]
    nested = target(tmp_path, mappings={"stage": "--zero_stage"})  # found inside a section
    assert nested.argv(config)[1:] == ["--zero_stage", "2"]
    auto = {"train_micro_batch_size_per_gpu": "auto"}  # left for the script's own default
    assert target(tmp_path, "--x", "1").argv(auto)[1:] == ["--x", "1"]


def test_config_keys_are_trimmed_and_the_script_names_its_config(tmp_path: Path) -> None:
    config = load_config(
        {"autotuning": {"arg_mappings": {" train_micro_batch_size_per_gpu ": " --mbs"}}}, 2
    )
    assert config.autotuning.arg_mappings == {"train_micro_batch_size_per_gpu": "--mbs"}
    assert target(tmp_path, "--deepspeed", "ds.json").config_path() == "ds.json"
    assert target(tmp_path, "--deepspeed_config=c.json").config_path() == "c.json"


def test_the_fingerprint_changes_with_the_script_file(tmp_path: Path) -> None:
    first = target(tmp_path, "--x", "1").fingerprint()
    (tmp_path / "train.py").write_text("print('changed')\n")
    assert (
        ScriptTarget.from_command([str(tmp_path / "train.py"), "--x", "1"]).fingerprint()["sha256"]
        != first["sha256"]
    )


def test_a_missing_script_or_module_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ScriptError, match="does not exist"):
        ScriptTarget.from_command([str(tmp_path / "nope.py")])
    with pytest.raises(ScriptError, match="cannot be found"):
        ScriptTarget.from_command(["-m", "no_such_module_anywhere"])


def test_cli_refuses_a_script_without_a_config_or_file(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from autotune.cli import app

    script = tmp_path / "train.py"
    script.write_text("print('hi')\n")
    runner = CliRunner()
    no_config = runner.invoke(app, ["run", "--", str(script), "--epochs", "1"])
    assert no_config.exit_code == 2 and "script mode needs a config" in no_config.output
    missing = runner.invoke(app, ["run", "--", str(tmp_path / "nope.py"), "--deepspeed", "x"])
    assert missing.exit_code == 2 and "does not exist" in missing.output


class MeasuringRunner:
    """Stands in for a runner of a script: every experiment is ok and measures a model of
    10M parameters holding 20 MB of activations per sample."""

    def __init__(self) -> None:
        self.names: list[str] = []

    def run(self, spec: ExperimentSpec) -> ExperimentResult:
        self.names.append(spec.name)
        micro = int(spec.ds_config["train_micro_batch_size_per_gpu"])
        metrics = Metrics.from_window([0.1], 2 * micro, 1e9, peak_memory_bytes=1)
        measured = replace(
            metrics,
            num_params=10_000_000,
            param_bytes=40_000_000,
            activation_bytes_per_sample=20_000_000,
        )
        return ExperimentResult(spec.name, Status.ok, measured)


def test_the_first_measured_experiment_gives_the_tuner_the_model_size(tmp_path: Path) -> None:
    config = load_config(
        {
            "zero_optimization": {"stage": [1, 2]},
            "autotuning": {"tuner_type": "gridsearch", "num_remeasure": 0},
        },
        world_size=2,
    )
    job = TuningJob(
        config=config,
        results_dir=tmp_path / "results",
        device_memory_bytes=1 << 30,
        script=target(tmp_path, "--deepspeed", "ds.json"),
    )
    runner = MeasuringRunner()
    tune(job, runner)
    # Nothing is known before the first experiment: it starts at the largest micro-batch.
    # Then the estimate (model states + 20 MB a sample in 1 GiB) starts stage 2 far lower.
    assert runner.names[0] == "z1_mbs1024"
    second_stage = [name for name in runner.names if name.startswith("z2_")]
    assert second_stage and int(second_stage[0].removeprefix("z2_mbs")) < 64, runner.names


def test_the_record_says_the_script_ran_not_a_workload(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from autotune.cli import app
    from autotune.results import load_results

    config = load_config(
        {
            "zero_optimization": {"stage": 1},
            "train_micro_batch_size_per_gpu": [2, 4],
            "autotuning": {"tuner_type": "gridsearch", "num_remeasure": 0},
        },
        world_size=2,
    )
    script = target(tmp_path, "--deepspeed", "ds.json")
    job = TuningJob(config=config, results_dir=tmp_path / "results", script=script)
    tune(job, MeasuringRunner())

    spec = json.loads((job.results_dir / "exps" / "z1_mbs2" / "spec.json").read_text())
    assert spec["workload"] is None and spec["workload_args"] == {}
    assert spec["script"]["path"] == str(tmp_path / "train.py")
    assert ExperimentSpec.from_dict(spec).target == "train.py"
    assert set(load_results(job.results_dir)["target"]) == {"train.py"}
    report = CliRunner().invoke(app, ["report", str(job.results_dir)])
    assert report.exit_code == 0 and "(train.py)" in report.stdout, report.stdout
