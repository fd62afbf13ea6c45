"""A TRL ``SFTTrainer`` script with a PEFT LoRA adapter (``sft_lora.py``, shaped like TRL's own
``trl/scripts/sft.py --use_peft``), tuned over ZeRO 0-3 and trained with the printed command.

At ZeRO-3 TRL's loss gathers the LM head when its ``ds_status`` says it is not AVAILABLE, and
the Trainer saves the adapter from ``_zero3_consolidated_16bit_state_dict``; the model and the
tokenizer are made here, the data is a folder of JSON lines: nothing is downloaded.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from autotune.results import load_results
from tests.client_scripts import micro_batch_used, train_with_best, tune, write
from tests.hf.sft_data import save_sft_checkpoint

pytest.importorskip("trl")
pytest.importorskip("peft")
pytestmark = [pytest.mark.multirank, pytest.mark.slow]

SFT = Path(__file__).parent / "sft_lora.py"


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_sft_checkpoint(tmp_path_factory.mktemp("sft"))


@pytest.mark.ray
def test_an_sft_lora_script_tunes_over_zero_0_to_3_and_trains_with_the_printed_command(
    ray_cluster: str, tmp_path: Path, checkpoint: Path
) -> None:
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    config = {
        # One micro-batch, not the script's default: each experiment proves the flag it was given.
        "train_micro_batch_size_per_gpu": [2],
        "gradient_accumulation_steps": "auto",
        "zero_optimization": {
            "stage": [0, 1, 2, 3],
            "stage3_gather_16bit_weights_on_model_save": True,
        },
        "autotuning": {
            "enabled": True,
            "fast": True,
            "tuner_type": "gridsearch",
            "num_remeasure": 0,
            "start_profile_step": 2,
            "end_profile_step": 3,
            "arg_mappings": {
                "train_micro_batch_size_per_gpu": "--per_device_train_batch_size",
            },
        },
    }
    path, results, out = write(tmp_path / "ds.json", config), tmp_path / "results", tmp_path / "out"
    # As TRL's sft.py is run, on CPU (SFTConfig turns bf16 on by default, which needs a GPU).
    tune(
        results,
        str(SFT),
        "--deepspeed",
        str(path),
        "--model_name_or_path",
        str(checkpoint / "model"),
        "--dataset_name",
        str(checkpoint / "data"),
        "--use_peft",
        "--max_length",
        "32",
        "--bf16",
        "false",
        "--max_steps",
        "3",
        "--logging_steps",
        "1",
        "--learning_rate",
        "1e-2",
        "--report_to",
        "none",
        "--save_strategy",
        "no",
        "--output_dir",
        str(out),
    )
    ok = load_results(results).query("status == 'ok'")
    assert len(ok) == 4 and set(ok["zero_stage"]) == {0, 1, 2, 3}, ok[["name", "status"]]
    for _, row in ok.iterrows():
        for rank in (0, 1):
            assert micro_batch_used(results, row["name"], rank) == row["micro_batch_size"]

    run = train_with_best(results)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "loss at step 3" in run.stdout
    # The adapter loads onto the base model, trained: LoRA's B starts at zero.
    base = AutoModelForCausalLM.from_pretrained(checkpoint / "model")
    tuned = PeftModel.from_pretrained(base, out)
    lora_b = {n: p for n, p in tuned.named_parameters() if "lora_B" in n}
    assert lora_b and all(bool(p.detach().abs().sum() > 0) for p in lora_b.values())
