"""A PyTorch Lightning script with ``DeepSpeedStrategy`` (``lightning_lm.py``), tuned over
ZeRO 0-3 and trained with the printed command; the same command under plain ``torchrun``
trains on the installed DeepSpeed too, with the same losses.

Lightning asks for DeepSpeed 0.16.0 or later under torch 2.6+, sets the level of
``deepspeed.utils.logging.logger``, and at ZeRO-3 its model summary counts ``ds_numel`` and
``partition_numel()`` of every parameter.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from autotune.results import load_results
from autotune.runner.deepspeed_engine import clear_leftovers, extensions_dir
from tests.client_scripts import (
    best_command,
    first_losses,
    micro_batch_used,
    train_with_best,
    tune,
    write,
)
from tests.deepspeed_installed import needs_deepspeed
from tests.torchrun import torchrun

pytest.importorskip("pytorch_lightning")
pytestmark = [pytest.mark.multirank, pytest.mark.slow]

SCRIPT = Path(__file__).parent / "lightning_lm.py"
CONFIG = {
    # One micro-batch, not the script's default: each experiment proves the flag it was given.
    "train_micro_batch_size_per_gpu": [4],
    # Every module gathered on its own at ZeRO-3, as a model of real size would be.
    "zero_optimization": {"stage": [0, 1, 2, 3], "stage3_param_persistence_threshold": 0},
    "autotuning": {
        "enabled": True,
        "fast": True,
        "tuner_type": "gridsearch",
        "num_remeasure": 0,
        "start_profile_step": 2,
        "end_profile_step": 3,
        "arg_mappings": {"train_micro_batch_size_per_gpu": "--batch_size"},
    },
}


@pytest.fixture(scope="module")
def tuned(tmp_path_factory: pytest.TempPathFactory, ray_cluster: str) -> Path:
    """The results of tuning the script over ZeRO 0-3 at micro-batch 4, 3 steps."""
    root = tmp_path_factory.mktemp("lightning")
    path, results = write(root / "ds_config.json", CONFIG), root / "results"
    args = ["--deepspeed_config", str(path), "--devices", "2", "--max_steps", "3"]
    tune(results, str(SCRIPT), *args, "--output_dir", str(root / "out"))
    return results


@pytest.fixture(scope="module")
def trained(tuned: Path) -> subprocess.CompletedProcess[str]:
    """The printed command, run."""
    return train_with_best(tuned)


@pytest.mark.ray
def test_a_lightning_script_tunes_over_zero_0_to_3_and_trains_with_the_printed_command(
    tuned: Path, trained: subprocess.CompletedProcess[str]
) -> None:
    ok = load_results(tuned).query("status == 'ok'")
    assert len(ok) == 4 and set(ok["zero_stage"]) == {0, 1, 2, 3}, ok[["name", "status"]]
    for _, row in ok.iterrows():
        for rank in (0, 1):
            assert micro_batch_used(tuned, row["name"], rank) == row["micro_batch_size"]
    assert trained.returncode == 0, trained.stderr[-3000:]
    assert len(first_losses(trained.stdout, 3)) == 3
    assert "saved to" in trained.stdout


@pytest.mark.ray
@needs_deepspeed
def test_the_printed_command_trains_alike_on_deepspeed_itself(
    tuned: Path, trained: subprocess.CompletedProcess[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The script and config are a real DeepSpeed client: plain torchrun of the same command
    (DeepSpeed's CPU accelerator) gives the built-in engine's losses."""
    command = best_command(tuned)
    monkeypatch.setenv("DS_ACCELERATOR", "cpu")
    # DeepSpeed on CPU builds its shared-memory all-reduce op on first use (minutes on 2 cores),
    # by default in PyTorch's folder, shared by every environment: there an op another
    # environment built is rebuilt, and a lock left by a killed build is waited on forever. So
    # it runs as a user of autotune would: built where this installation's DeepSpeed engine
    # builds its ops (once, shared with the engine's tests), stale locks cleared first.
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", extensions_dir())
    clear_leftovers()
    deepspeed = torchrun(*command[command.index("--") + 1 :], timeout_s=240)
    assert deepspeed.returncode == 0, deepspeed.stderr[-3000:]
    assert first_losses(deepspeed.stdout, 3) == pytest.approx(
        first_losses(trained.stdout, 3), rel=1e-4
    )
