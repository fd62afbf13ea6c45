"""Scripts tuned as their users launch them, at world size 2, and trained with the command
printed: ``accelerate launch`` with TRL's own ZeRO-2 YAML, TRL's ``trl sft`` with its ZeRO-3
one, a LLaMA-Factory-shaped entry (a YAML naming its DeepSpeed file, ``key=value``
overrides); and a client that read another config than the experiment's, which is an error.

TRL's YAMLs are used as TRL ships them, but for ``num_processes: 2`` and, on a machine without
a GPU, ``mixed_precision: 'no'``: the HF Trainer refuses bf16 without a bf16 GPU (its own
check, with DeepSpeed itself too).
"""

from __future__ import annotations

import importlib.resources
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from autotune.cli import app
from autotune.results import load_results
from tests.client_scripts import (
    cli,
    client_stage,
    micro_batch_used,
    train_with_best,
    tune,
    write,
)
from tests.hf.sft_data import save_sft_checkpoint

pytest.importorskip("trl")
pytest.importorskip("peft")
pytestmark = [pytest.mark.multirank, pytest.mark.slow]

HERE = Path(__file__).parent
SFT = HERE / "sft_lora.py"
ACCELERATE_LOOP = HERE / "clm_accelerate.py"
LLAMAFACTORY = HERE / "lf_train.py"
# A short search, the window at steps 2-3: the micro-batch is searched from 1024 down past a
# rank's share of the examples (each such size refused at its first micro-batch, in seconds),
# then the sizes that run.
SEARCH = ["--num-trials", "6", "--start-profile-step", "2", "--end-profile-step", "3"]


def trl_yaml(tmp_path: Path, name: str, **changes: Any) -> Path:
    """TRL's ``accelerate_configs/<name>.yaml`` at world size 2, in fp32 (see above)."""
    shipped = importlib.resources.files("trl.accelerate_configs").joinpath(f"{name}.yaml")
    config = yaml.safe_load(shipped.read_text())
    config.update({"num_processes": 2, "mixed_precision": "no", **changes})
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_sft_checkpoint(tmp_path_factory.mktemp("sft"))


def sft_args(checkpoint: Path, out: Path) -> list[str]:
    """TRL's SFT flags, on CPU, a LoRA adapter, 3 steps."""
    return [
        "--model_name_or_path", str(checkpoint / "model"),
        "--dataset_name", str(checkpoint / "data"),
        "--use_peft", "--max_length", "32", "--bf16", "false", "--max_steps", "3",
        "--logging_steps", "1", "--learning_rate", "1e-2", "--report_to", "none",
        "--save_strategy", "no", "--output_dir", str(out),
    ]  # fmt: skip


def ok_experiments(results: Path, stage: int, at_least: int = 2) -> Any:
    """The experiments that ran ok, ``at_least`` of them, each at ``stage`` and at the
    micro-batch its client configured and fed (both ranks)."""
    frame = load_results(results)
    ok = frame.query("status == 'ok'")
    shown = frame[["name", "status", "error"]]
    assert len(ok) >= at_least and set(ok["zero_stage"]) == {stage}, shown
    for _, row in ok.iterrows():
        for rank in (0, 1):
            assert client_stage(results, row["name"], rank) == stage
            assert micro_batch_used(results, row["name"], rank) == row["micro_batch_size"]
    return frame


def printed(results: Path) -> str:
    command = cli.invoke(app, ["best", str(results), "--command"])
    assert command.exit_code == 0, command.output
    return command.stdout.strip()


@pytest.mark.ray
def test_accelerate_launch_with_trls_zero2_yaml_tunes_an_sft_script_that_then_trains(
    ray_cluster: str, tmp_path: Path, checkpoint: Path
) -> None:
    results, out = tmp_path / "results", tmp_path / "out"
    config = trl_yaml(tmp_path, "zero2")
    launch = ["accelerate", "launch", "--config_file", str(config), str(SFT)]
    args = [*sft_args(checkpoint, out), "--per_device_train_batch_size", "2"]
    summary = tune(results, *launch, *args, flags=SEARCH)
    assert "at world size 2" in (results / "summary.txt").read_text()  # num_processes
    frame = ok_experiments(results, 2)
    # 256 examples, 128 a rank: a larger micro-batch would be filled with repeated samples.
    over = frame[frame["micro_batch_size"] > 128]
    assert (over["status"] != "ok").all(), over[["name", "status"]]
    assert all("more than a rank's share of the data" in e for e in over["error"])

    tuned = results / "accelerate_config_optimal.yaml"
    optimal = str((results / "ds_config_optimal.json").resolve())
    assert yaml.safe_load(tuned.read_text())["deepspeed_config"]["deepspeed_config_file"] == (
        optimal
    )
    command = printed(results)
    assert command.startswith(
        f"autotune exec --nproc 2 -- accelerate launch --config_file {tuned.resolve()} {SFT}"
    )
    micro = summary["best_overrides"]["train_micro_batch_size_per_gpu"]
    assert f"--per_device_train_batch_size {micro}" in command
    # The YAML's "auto" stays: the Trainer fills it from the flag the command sets.
    best = json.loads((results / "ds_config_optimal.json").read_text())
    assert best["train_micro_batch_size_per_gpu"] == "auto"
    run = train_with_best(results)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "loss at step 3" in run.stdout and "client stage: 2" in run.stdout


@pytest.mark.ray
def test_trl_sft_with_trls_zero3_yaml_is_tuned_and_its_command_trains(
    ray_cluster: str, tmp_path: Path, checkpoint: Path
) -> None:
    """TRL's own ``trl/scripts/sft.py``, started as ``trl sft --accelerate_config``."""
    results, out = tmp_path / "results", tmp_path / "out"
    config = trl_yaml(tmp_path, "zero3")
    tune(results, "trl", "sft", "--accelerate_config", str(config),
         *sft_args(checkpoint, out), flags=SEARCH)  # fmt: skip
    frame = load_results(results)
    ok = frame.query("status == 'ok'")
    assert len(ok) >= 2 and set(ok["zero_stage"]) == {3}, frame[["name", "status", "error"]]
    command = printed(results)
    tuned = (results / "accelerate_config_optimal.yaml").resolve()
    assert command.startswith(f"autotune exec --nproc 2 -- trl sft --accelerate_config {tuned}")
    run = train_with_best(results)
    assert run.returncode == 0, run.stderr[-3000:]
    assert (out / "adapter_config.json").is_file()


@pytest.mark.ray
def test_an_accelerate_loop_launched_with_a_bf16_zero3_yaml_trains_in_bf16(
    ray_cluster: str, tmp_path: Path
) -> None:
    """run_clm_no_trainer's shape: an ``Accelerator()`` that takes DeepSpeed and the mixed
    precision from the launch; the YAML's ``mixed_precision: bf16`` reaches the engine."""
    results = tmp_path / "results"
    config = trl_yaml(tmp_path, "zero3", mixed_precision="bf16")
    launch = ["accelerate", "launch", "--config_file", str(config), str(ACCELERATE_LOOP)]
    tune(results, *launch, "--per_device_train_batch_size", "4", "--max_train_steps", "3",
         flags=SEARCH)  # fmt: skip
    # The stage is the YAML's and the micro-batch's search stops at the largest that runs
    # when the cost model expects no knob of ZeRO-3 to gain more than the tolerance: one
    # experiment ok may be the whole answer.
    frame = ok_experiments(results, 3, at_least=1)
    for name in frame.query("status == 'ok'")["name"]:
        assert "model dtype: torch.bfloat16" in (results / "exps" / name / "rank0.out").read_text()
    assert json.loads((results / "ds_config_optimal.json").read_text())["bf16"] == {"enabled": True}


@pytest.mark.ray
def test_a_llamafactory_shaped_entry_is_tuned_from_its_yaml_and_its_command_trains(
    ray_cluster: str, tmp_path: Path
) -> None:
    ds = write(
        tmp_path / "ds_z2_config.json",
        {
            "train_batch_size": "auto",
            "train_micro_batch_size_per_gpu": "auto",
            "gradient_accumulation_steps": "auto",
            "gradient_clipping": "auto",
            "zero_allow_untested_optimizer": True,
            "bf16": {"enabled": "auto"},
            "zero_optimization": {"stage": 2, "overlap_comm": False, "contiguous_gradients": True},
        },
    )
    cfg = tmp_path / "sft.yaml"
    cfg.write_text(
        yaml.safe_dump(
            {
                "deepspeed": str(ds),
                "per_device_train_batch_size": 2,
                "max_steps": 3,
                "logging_steps": 1,
                "report_to": "none",
                "save_strategy": "no",
                "output_dir": str(tmp_path / "out"),
            }
        )
    )
    results = tmp_path / "results"
    summary = tune(
        results, str(LLAMAFACTORY), str(cfg), "learning_rate=0.001", flags=["-n", "2", *SEARCH]
    )
    ok_experiments(results, 2)
    command = printed(results)
    optimal = (results / "ds_config_optimal.json").resolve()
    micro = summary["best_overrides"]["train_micro_batch_size_per_gpu"]
    assert command.endswith(
        f"learning_rate=0.001 per_device_train_batch_size={micro} deepspeed={optimal}"
    )
    # The user's "auto" values stay for the Trainer to fill in (the micro-batch from the
    # override the command sets), so a later per_device_train_batch_size=N still trains.
    best = json.loads(optimal.read_text())
    assert best["bf16"] == {"enabled": "auto"}
    assert best["train_micro_batch_size_per_gpu"] == best["train_batch_size"] == "auto"
    run = train_with_best(results)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "loss at step 3" in run.stdout


def test_a_client_that_read_another_config_than_the_experiments_is_an_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Accelerate's environment set by hand to a ZeRO-2 file, as one would to run a script
    that takes no config argument: the ZeRO-3 experiment's client configures itself for ZeRO 2,
    and the experiment says so instead of measuring ZeRO 3 as "ok"."""
    stage2 = write(
        tmp_path / "ds_zero2.json",
        {"train_micro_batch_size_per_gpu": "auto", "zero_optimization": {"stage": 2}},
    )
    monkeypatch.setenv("ACCELERATE_USE_DEEPSPEED", "true")
    monkeypatch.setenv("ACCELERATE_DEEPSPEED_CONFIG_FILE", str(stage2))
    tuned = write(
        tmp_path / "ds_tune.json",
        {
            "train_micro_batch_size_per_gpu": 4,
            "zero_optimization": {"stage": [2, 3]},
            "autotuning": {"start_profile_step": 1, "end_profile_step": 1, "num_remeasure": 0},
        },
    )
    results = tmp_path / "results"
    outcome = cli.invoke(
        app,
        ["run", "-c", str(tuned), "--runner", "local", "--results-dir", str(results), "-q",
         "--", str(ACCELERATE_LOOP), "--per_device_train_batch_size", "4",
         "--max_train_steps", "3"],
    )  # fmt: skip
    assert outcome.exit_code == 0, outcome.output
    frame = load_results(results).set_index("name")
    assert frame.loc["z2_mbs4", "status"] == "ok"
    assert frame.loc["z3_mbs4", "status"] == "error"
    assert frame.loc["z3_mbs4", "error"].startswith(
        "ClientConfigMismatch: the script's client built its engine with ZeRO stage 2 "
        "(zero_optimization.stage), where the experiment runs 3"
    )
