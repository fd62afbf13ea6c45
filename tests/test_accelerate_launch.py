"""``accelerate launch`` read without running it: TRL's own DeepSpeed YAMLs turned into the
config to tune, the world size and each experiment's environment, checked against Accelerate's
own ``DeepSpeedPlugin`` and config loader (the real packages, no ranks)."""

from __future__ import annotations

import importlib.resources
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from autotune.accelerate_launch import LaunchError, parse_accelerate_launch, with_precision
from autotune.api import RunRequest, load_job
from autotune.config import ConfigError
from autotune.run_options import RunOptions
from autotune.script_target import ScriptError, ScriptTarget, launch_yaml_path

pytest.importorskip("accelerate")
trl_configs = pytest.importorskip("trl.accelerate_configs")


def trl_yaml(name: str) -> Path:
    """One of the DeepSpeed YAMLs TRL ships (``examples/accelerate_configs``)."""
    return Path(str(importlib.resources.files(trl_configs).joinpath(f"{name}.yaml")))


def written(path: Path, data: dict[str, Any]) -> Path:
    path.write_text(yaml.safe_dump(data))
    return path


def script(tmp_path: Path) -> Path:
    path = tmp_path / "sft.py"
    path.write_text("print('hi')\n")
    return path


def test_trls_zero2_and_zero3_yamls_become_the_config_accelerate_builds(tmp_path: Path) -> None:
    zero2, command = parse_accelerate_launch(
        ["--config_file", str(trl_yaml("zero2")), str(script(tmp_path)), "--lr", "1"]
    )
    assert command == [str(script(tmp_path)), "--lr", "1"]
    assert zero2.num_processes == 8 and zero2.mixed_precision == "bf16"
    assert zero2.map_config() == {
        "train_batch_size": "auto",
        "train_micro_batch_size_per_gpu": "auto",
        "gradient_accumulation_steps": "auto",
        "gradient_clipping": "auto",
        "zero_optimization": {"stage": 2},
    }
    zero3, _ = parse_accelerate_launch(["--config_file", str(trl_yaml("zero3")), "sft.py"])
    assert zero3.map_config()["zero_optimization"] == {
        "stage": 3,
        "stage3_gather_16bit_weights_on_model_save": True,
    }
    # Accelerate's mixed_precision, as its plugin adds it: where the config has no section.
    assert with_precision(zero3.map_config(), "bf16")["bf16"] == {"enabled": True}
    assert with_precision({"bf16": {"enabled": False}}, "bf16")["bf16"] == {"enabled": False}
    with pytest.raises(LaunchError, match="contradicts"):
        with_precision({"fp16": {"enabled": True}}, "bf16")


def test_flags_win_over_the_yaml_and_the_rest_are_kept_for_the_command(tmp_path: Path) -> None:
    argv = ["--config_file", str(trl_yaml("zero1")), "--num_processes", "2", "--zero_stage", "3"]
    argv += ["--main_process_port", "29999", "--mixed_precision=no", "-m", "pkg.train", "--x"]
    launch, command = parse_accelerate_launch(argv)
    assert command == ["-m", "pkg.train", "--x"]
    assert launch.num_processes == 2 and launch.mixed_precision == "no"
    assert launch.map_config()["zero_optimization"]["stage"] == 3
    assert launch.map_config()["gradient_accumulation_steps"] == 1  # zero1.yaml's
    assert launch.kept_args == ("--main_process_port", "29999")


def test_each_experiment_hands_accelerate_its_own_file_as_accelerate_reads_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The experiment's environment makes Accelerate's own DeepSpeedPlugin read the
    experiment's file (its stage and micro-batch), without the checks it makes of a YAML that
    holds both a map and a file tripping."""
    from accelerate.utils import DeepSpeedPlugin

    launch, _ = parse_accelerate_launch(["--config_file", str(trl_yaml("zero3")), "sft.py"])
    experiment = tmp_path / "ds_config.json"
    experiment.write_text(
        json.dumps({"train_micro_batch_size_per_gpu": 4, "zero_optimization": {"stage": 1}})
    )
    env = launch.with_config_file(str(experiment), 2).environment()
    assert env["ACCELERATE_USE_DEEPSPEED"] == "true"
    assert env["ACCELERATE_DEEPSPEED_CONFIG_FILE"] == str(experiment)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with pytest.warns(UserWarning, match="Zero3 Init flag"):  # the YAML's, for stage 3 only
        plugin = DeepSpeedPlugin()
    assert plugin.zero_stage == 1
    assert plugin.deepspeed_config["train_micro_batch_size_per_gpu"] == 4
    # The map's own environment, as accelerate launch sets it for the YAML as written.
    assert launch.environment()["ACCELERATE_DEEPSPEED_ZERO_STAGE"] == "3"
    assert "mixed_precision" in launch.environment()["ACCELERATE_CONFIG_DS_FIELDS"]


def test_the_tuned_yaml_loads_in_accelerate_and_names_the_optimal_file(tmp_path: Path) -> None:
    from accelerate.commands.config.config_args import load_config_from_file

    launch, _ = parse_accelerate_launch(["--config_file", str(trl_yaml("zero3")), "sft.py"])
    optimal = str(tmp_path / "ds_config_optimal.json")
    path = Path(launch_yaml_path(optimal))
    path.write_text(launch.with_config_file(optimal, 2).tuned_yaml())
    loaded = load_config_from_file(str(path))
    assert loaded.num_processes == 2 and loaded.mixed_precision is None
    assert loaded.deepspeed_config == {
        "deepspeed_config_file": optimal,
        "deepspeed_multinode_launcher": "standard",
        "zero3_init_flag": True,
    }
    again, _ = parse_accelerate_launch(["--config_file", str(path), "sft.py"])
    assert again.config_file == optimal


@pytest.mark.parametrize(
    ("change", "says"),
    [
        ({"distributed_type": "MULTI_GPU"}, "distributed_type is MULTI_GPU, not DEEPSPEED"),
        ({"num_machines": 2}, "num_machines > 1"),
        ({"zero_stage": 2}, r"Accelerate refuses it: .*unknown keys \(\['zero_stage'\]\)"),
        (
            {"deepspeed_config": {"deepspeed_config_file": "ds.json", "zero_stage": 2}},
            "with deepspeed_config_file, Accelerate refuses zero_stage, mixed_precision",
        ),
    ],
)
def test_a_launch_that_cannot_be_tuned_says_why_in_one_line(
    tmp_path: Path, change: dict[str, Any], says: str
) -> None:
    config = yaml.safe_load(trl_yaml("zero2").read_text()) | change
    path = written(tmp_path / "accelerate.yaml", config)
    with pytest.raises(LaunchError, match=says):
        parse_accelerate_launch(["--config_file", str(path), "sft.py"])


def test_a_run_takes_its_world_size_and_config_from_the_launch(tmp_path: Path) -> None:
    config = yaml.safe_load(trl_yaml("zero2").read_text()) | {"num_processes": 2}
    path = written(tmp_path / "z2.yaml", config)
    command = ["accelerate", "launch", "--config_file", str(path), str(script(tmp_path)), "--x"]
    job = load_job(RunRequest(RunOptions(script=command, results_dir=str(tmp_path / "r"))))
    assert job.world_size == 2 and job.label == "accelerate launch sft.py"
    assert job.config.zero_optimization.stage == 2
    assert job.config.spec["bf16"] == {"enabled": True}  # mixed_precision: bf16
    assert job.script is not None and job.script.args == ("--x",)
    given = RunRequest(RunOptions(script=command, world_size=4, results_dir=str(tmp_path)))
    assert load_job(given).world_size == 4  # --world-size wins over num_processes


def test_the_command_is_accelerate_launch_with_the_tuned_yaml(tmp_path: Path) -> None:
    path = written(tmp_path / "z2.yaml", yaml.safe_load(trl_yaml("zero2").read_text()))
    launched = ScriptTarget.from_command(
        ["accelerate", "launch", "--config_file", str(path), str(script(tmp_path)), "--bs", "1"],
        {"train_micro_batch_size_per_gpu": "--bs"},
    )
    optimal = str(tmp_path / "ds_config_optimal.json")
    best = {"train_micro_batch_size_per_gpu": 4}
    tuned = launch_yaml_path(optimal)
    builtin = launched.command(best, optimal, ["autotune", "exec", "--nproc", "2", "--"])
    launch = ["accelerate", "launch", "--config_file", tuned]
    assert builtin[:5] == ["autotune", "exec", "--nproc", "2", "--"]
    assert builtin[5:] == [*launch, str(script(tmp_path)), "--bs", "4"]
    # On DeepSpeed itself accelerate launch is the launcher: no torchrun around it.
    on_deepspeed = launched.command(best, optimal, ["torchrun", "--nproc_per_node", "2"])
    assert on_deepspeed[:4] == ["accelerate", "launch", "--config_file", tuned]


def test_a_yaml_given_as_the_config_says_how_to_tune_it(tmp_path: Path) -> None:
    accelerate = written(tmp_path / "z2.yaml", {"distributed_type": "DEEPSPEED"})
    with pytest.raises(ConfigError, match="accelerate launch --config_file"):
        load_job(RunRequest(RunOptions(config=accelerate, script=[str(script(tmp_path))])))
    factory = written(tmp_path / "sft.yaml", {"deepspeed": "ds_z2_config.json"})
    with pytest.raises(ConfigError, match=r"-m llamafactory\.launcher"):
        load_job(RunRequest(RunOptions(config=factory, script=[str(script(tmp_path))])))


def test_accelerate_launch_without_deepspeed_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ScriptError, match="not DEEPSPEED"):
        ScriptTarget.from_command(["accelerate", "launch", str(script(tmp_path))])
