"""A DeepSpeed training script launched by torchrun on two processes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.torchrun import torchrun

HERE = Path(__file__).parent
RESUME_SCRIPT = HERE / "ds_resume_script.py"

pytestmark = pytest.mark.multirank


def _ds_config(tmp_path: Path, stage: int) -> Path:
    """A config as DeepSpeedExamples write them, foreign top-level key included."""
    config = {
        "train_batch_size": 16,
        "train_micro_batch_size_per_gpu": 4,
        "steps_per_print": 2000,
        "optimizer": {"type": "AdamW", "params": {"lr": 0.01, "weight_decay": 0.01}},
        "scheduler": {
            "type": "WarmupLR",
            "params": {"warmup_min_lr": 0, "warmup_max_lr": 0.01, "warmup_num_steps": 4},
        },
        "gradient_clipping": 1.0,
        "fp16": {"enabled": True, "loss_scale": 0, "initial_scale_power": 8, "hysteresis": 2},
        "wall_clock_breakdown": False,
        "zero_optimization": {"stage": stage, "overlap_comm": True, "reduce_bucket_size": 500},
        "cuda_visible_devices": 0,
    }
    path = tmp_path / "ds_config.json"
    path.write_text(json.dumps(config))
    return path


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_deepspeed_script_resumes_like_an_uninterrupted_run(tmp_path: Path, stage: int) -> None:
    """Save at step 3, load, continue: the losses are those of a run never stopped. At stage 2
    the process is killed after saving and a new one resumes (a real restart)."""
    config = _ds_config(tmp_path, stage)
    common = ["--deepspeed", "--deepspeed_config", str(config), "--save_dir", str(tmp_path)]
    if stage != 2:
        done = torchrun(str(RESUME_SCRIPT), *common)
    else:
        killed = torchrun(str(RESUME_SCRIPT), *common, "--kill")
        assert killed.returncode != 0, "the first run was to be killed after saving"
        assert (tmp_path / "latest").read_text() == "global_step3", killed.stderr
        done = torchrun(str(RESUME_SCRIPT), *common, "--resume_only")
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.count(" resume ok: ") == 2, done.stdout + done.stderr


def test_a_script_shaped_like_deepspeedexamples_cifar_trains_unchanged() -> None:
    """cifar10_deepspeed.py's calls as it makes them: its config dict (``cpu_offload``,
    ``prescale_gradients`` ...), ``get_accelerator().device_name(local_rank)``,
    ``fp16_enabled()`` for the input dtype, ZeRO-3, then ``eval()`` and a test pass."""
    done = torchrun(str(HERE / "cifar_script.py"), "--dtype", "fp16", "--stage", "3")
    assert done.returncode == 0, done.stdout + done.stderr
    for rank in (0, 1):
        assert f"rank {rank}: device=cpu dtype=torch.float16 stage=3" in done.stdout
    assert done.stdout.count("Finished Training") == 2, done.stdout
    assert "Accuracy of the network on the 8 test images" in done.stdout
