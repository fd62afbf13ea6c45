"""The HF Trainer script of tests/hf on a GPU: trained with ``autotune exec`` on one rank at
ZeRO stages 0-3 in fp32 and bf16, its model on ``cuda:LOCAL_RANK`` (the Trainer checks the loss
is on its device), the losses finite and stage 3's saved weights whole."""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.gpu.cuda_cases import NEEDS_CUDA, record

pytestmark = NEEDS_CUDA
REPO = Path(__file__).resolve().parents[2]
TRAINER = REPO / "tests" / "hf" / "clm_trainer.py"


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_the_trainer_script_trains_on_the_gpu(tmp_path: Path, stage: int, precision: str) -> None:
    pytest.importorskip("transformers")
    pytest.importorskip("accelerate")
    zero = {"stage": stage, "stage3_gather_16bit_weights_on_model_save": True}
    config = {"train_micro_batch_size_per_gpu": 8, "zero_optimization": zero}
    if precision == "bf16":
        config["bf16"] = {"enabled": True}
    path = tmp_path / "ds_config.json"
    path.write_text(json.dumps(config))
    command = [
        sys.executable, "-m", "autotune", "exec", "--nproc", "1", "--", str(TRAINER),
        "--deepspeed", str(path), "--output_dir", str(tmp_path / "out"),
        "--per_device_train_batch_size", "8", "--max_steps", "5", "--logging_steps", "1",
        "--report_to", "none", "--save_strategy", "no",
        *(["--bf16"] if precision == "bf16" else []),
    ]  # fmt: skip
    # Prepended: a GPU machine's extra packages (gpu_check.sh's wheels) come by PYTHONPATH too.
    paths = [str(REPO / "tests" / "hf"), str(REPO), os.environ.get("PYTHONPATH", "")]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, paths))}
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=300)
    record(f"hf_trainer_z{stage}_{precision}", {"stdout": done.stdout[-3000:]})
    assert done.returncode == 0, done.stderr[-3000:]
    losses = [float(x) for x in re.findall(r"loss at step \d+: ([-\d.e]+)", done.stdout)]
    assert len(losses) == 5 and all(math.isfinite(x) for x in losses), done.stdout[-2000:]
    assert (tmp_path / "out" / "model.safetensors").is_file()
