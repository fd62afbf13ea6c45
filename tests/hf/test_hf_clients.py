"""A Hugging Face ``Trainer`` script and an Accelerate loop, tuned and trained unchanged.

Both scripts here (``clm_trainer.py``, shaped like transformers' ``run_clm.py``, and
``clm_accelerate.py``, like ``run_clm_no_trainer.py``) know nothing of autotune: they import
``transformers`` and ``accelerate``, which find autotune standing in for DeepSpeed.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from autotune.cli import app
from autotune.results import load_results
from tests.client_scripts import (
    autotune_exec,
    cli,
    first_losses,
    micro_batch_used,
    tune,
    write,
)
from tests.torchrun import torchrun

pytest.importorskip("transformers")
pytest.importorskip("accelerate")
pytestmark = pytest.mark.multirank

HERE = Path(__file__).parent
TRAINER = HERE / "clm_trainer.py"
ACCELERATE = HERE / "clm_accelerate.py"

# DeepSpeedExamples' training/autotuning/hf config: the micro-batch left to the tuner, mapped
# onto the Trainer's flags (the stray space is theirs), and no zero_optimization section, which
# the Trainer refuses on its own. Bounded here so that a test run stays short.
DS_CONFIG_TUNE = {
    "train_micro_batch_size_per_gpu": "auto",
    "autotuning": {
        "enabled": True,
        "overwrite": False,
        "arg_mappings": {
            "train_micro_batch_size_per_gpu": "--per_device_train_batch_size",
            "gradient_accumulation_steps ": "--gradient_accumulation_steps",
        },
    },
}
BOUNDS = {
    "max_train_micro_batch_size_per_gpu": 4,
    # The grid's first 5: each stage at micro-batch 4, then smaller ones; 3 ok over 2 stages.
    "tuner_num_trials": 5,
    "tuner_type": "gridsearch",
    "num_remeasure": 0,
    "start_profile_step": 2,
    "end_profile_step": 3,
}
# The ZeRO-2 template of transformers' DeepSpeed guide: every value the Trainer knows is "auto".
ZERO2_AUTO = {
    "fp16": {
        "enabled": "auto",
        "loss_scale": 0,
        "loss_scale_window": 1000,
        "initial_scale_power": 16,
        "hysteresis": 2,
        "min_loss_scale": 1,
    },
    "bf16": {"enabled": "auto"},
    "optimizer": {
        "type": "AdamW",
        "params": {"lr": "auto", "betas": "auto", "eps": "auto", "weight_decay": "auto"},
    },
    "scheduler": {
        "type": "WarmupLR",
        "params": {"warmup_min_lr": "auto", "warmup_max_lr": "auto", "warmup_num_steps": "auto"},
    },
    "zero_optimization": {
        "stage": 2,
        "offload_optimizer": {"device": "cpu", "pin_memory": True},
        "allgather_partitions": True,
        "allgather_bucket_size": 5e8,
        "overlap_comm": True,
        "reduce_scatter": True,
        "reduce_bucket_size": 5e8,
        "contiguous_gradients": True,
    },
    "gradient_accumulation_steps": "auto",
    "gradient_clipping": "auto",
    "steps_per_print": 2000,
    "train_batch_size": "auto",
    "train_micro_batch_size_per_gpu": "auto",
    "wall_clock_breakdown": False,
}


def trainer_args(per_device_batch: int, max_steps: int) -> list[str]:
    """The Trainer script's flags: batch and steps, no reporting or checkpoints, a loss a step."""
    return [
        "--per_device_train_batch_size",
        str(per_device_batch),
        "--max_steps",
        str(max_steps),
        "--report_to",
        "none",
        "--save_strategy",
        "no",
        "--logging_steps",
        "1",
    ]


TRAINER_ARGS = trainer_args(1, 40)


def assert_tuned(results: Path) -> Any:
    """At least 3 experiments ran ok over 2 stages or more, each at the micro-batch its
    client used; the optimal config and the training command were written."""
    ok = load_results(results).query("status == 'ok'")
    assert len(ok) >= 3 and ok["zero_stage"].nunique() >= 2, ok[["name", "status"]]
    for _, row in ok.iterrows():
        for rank in (0, 1):
            assert micro_batch_used(results, row["name"], rank) == row["micro_batch_size"]
    optimal = json.loads((results / "ds_config_optimal.json").read_text())
    command = cli.invoke(app, ["best", str(results), "--command"])
    assert command.exit_code == 0, command.output
    assert command.stdout.startswith("autotune exec --nproc 2 -- ")
    assert f"--per_device_train_batch_size {optimal['train_micro_batch_size_per_gpu']}" in (
        command.stdout
    )
    assert command.stdout.strip() in (results / "summary.txt").read_text()
    return optimal


@pytest.mark.ray
def test_deepspeedexamples_tune_config_tunes_a_trainer_script(
    ray_cluster: str, tmp_path: Path
) -> None:
    config = {**DS_CONFIG_TUNE, "autotuning": {**DS_CONFIG_TUNE["autotuning"], **BOUNDS}}
    path, results = write(tmp_path / "ds_config_tune.json", config), tmp_path / "results"
    out = tmp_path / "out"
    tune(results, str(TRAINER), "--deepspeed", str(path), "--output_dir", str(out), *TRAINER_ARGS)
    optimal = assert_tuned(results)
    assert set(optimal) == {"train_micro_batch_size_per_gpu", "zero_optimization"}


@pytest.mark.ray
def test_the_zero2_template_full_of_auto_tunes_and_keeps_its_autos(
    ray_cluster: str, tmp_path: Path
) -> None:
    config = {**ZERO2_AUTO, "autotuning": {**DS_CONFIG_TUNE["autotuning"], **BOUNDS}}
    config["zero_optimization"] = {**ZERO2_AUTO["zero_optimization"], "stage": [1, 2]}
    path, results = write(tmp_path / "ds_config.json", config), tmp_path / "results"
    out = tmp_path / "out"
    tune(results, str(TRAINER), "--deepspeed", str(path), "--output_dir", str(out), *TRAINER_ARGS)
    optimal = assert_tuned(results)
    # What the Trainer fills in stays "auto", for the same script to fill again.
    assert optimal["optimizer"]["params"] == ZERO2_AUTO["optimizer"]["params"]
    assert optimal["gradient_accumulation_steps"] == optimal["train_batch_size"] == "auto"
    assert optimal["zero_optimization"]["stage"] in (1, 2)


@pytest.mark.ray
def test_an_accelerate_loop_is_tuned(ray_cluster: str, tmp_path: Path) -> None:
    config = {
        "train_micro_batch_size_per_gpu": "auto",
        "gradient_accumulation_steps": "auto",
        "optimizer": {"type": "AdamW", "params": {"lr": "auto", "weight_decay": "auto"}},
        "scheduler": {
            "type": "WarmupDecayLR",
            "params": {
                "warmup_min_lr": "auto",
                "warmup_max_lr": "auto",
                "warmup_num_steps": "auto",
                "total_num_steps": "auto",
            },
        },
        "autotuning": {**DS_CONFIG_TUNE["autotuning"], **BOUNDS},
    }
    path, results = write(tmp_path / "ds_config.json", config), tmp_path / "results"
    tune(results, str(ACCELERATE), "--deepspeed_config", str(path), "--max_train_steps", "40")
    assert_tuned(results)


@pytest.fixture(scope="module")
def saved_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A model to start every run from, saved as from_pretrained reads one."""
    from transformers import AutoConfig, AutoModelForCausalLM, set_seed

    set_seed(7)
    config = AutoConfig.for_model(
        "gpt2",
        n_layer=2,
        n_embd=64,
        n_head=2,
        vocab_size=128,
        n_positions=32,
        bos_token_id=0,
        eos_token_id=0,
    )
    path = tmp_path_factory.mktemp("init")
    AutoModelForCausalLM.from_config(config).save_pretrained(path)
    return path


@pytest.mark.slow
def test_training_at_stage_3_on_the_built_in_engine_matches_ddp_and_saves_whole_weights(
    tmp_path: Path, saved_model: Path
) -> None:
    """``autotune exec`` of the Trainer script with a tuned config, against the same script
    under plain DDP: the same first 3 losses (fp32), and at stage 3 ``save_model()`` writes
    whole weights, equal to DDP's, that load into a fresh model. Stage 3 only: the one whose
    parameters, gradients and optimizer are all sharded, which the Trainer builds under
    ``zero.Init`` and gathers to save; that every stage matches one process is the engine's
    own tests', and the Trainer is run at every stage by this file's tuning tests."""
    from transformers import AutoModelForCausalLM

    common = ["--model_name_or_path", str(saved_model), *trainer_args(4, 3)]
    ddp = torchrun(str(TRAINER), "--use_cpu", "--output_dir", str(tmp_path / "ddp"), *common)
    assert ddp.returncode == 0, ddp.stderr[-2000:]
    expected = first_losses(ddp.stdout, 3)
    zero = {"stage": 3, "stage3_gather_16bit_weights_on_model_save": True}
    config = write(
        tmp_path / "z3.json", {"train_micro_batch_size_per_gpu": 4, "zero_optimization": zero}
    )
    run = autotune_exec(TRAINER, "--deepspeed", config, "--output_dir", tmp_path / "z3", *common)
    assert run.returncode == 0, run.stderr[-2000:]
    assert first_losses(run.stdout, 3) == pytest.approx(expected, rel=1e-4)
    whole = AutoModelForCausalLM.from_pretrained(tmp_path / "z3").state_dict()
    reference = AutoModelForCausalLM.from_pretrained(tmp_path / "ddp").state_dict()
    assert whole.keys() == reference.keys()
    for name, tensor in reference.items():
        assert whole[name].shape == tensor.shape
        assert (whole[name] - tensor).abs().max() <= 1e-4, name


def test_an_accelerate_loop_trains_in_bf16_on_the_built_in_engine(tmp_path: Path) -> None:
    config = write(
        tmp_path / "ds.json",
        {"train_micro_batch_size_per_gpu": "auto", "zero_optimization": {"stage": 1}},
    )
    run = autotune_exec(
        ACCELERATE,
        "--deepspeed_config",
        config,
        "--per_device_train_batch_size",
        "4",
        "--max_train_steps",
        "3",
        "--mixed_precision",
        "bf16",
    )
    assert run.returncode == 0, run.stderr[-2000:]
    assert "model dtype: torch.bfloat16" in run.stdout
    assert len(first_losses(run.stdout, 3)) == 3
