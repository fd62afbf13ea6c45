"""The real LLaMA-Factory tuned as its users launch it, then trained with the printed command.

    PYTHONPATH=. LF_VENV/bin/python experiments/llamafactory_real.py [--world-size 2]
        [--num-trials 8] [--out results/llamafactory_real.json]

LLaMA-Factory 0.9.5 pins transformers <= 5.6, accelerate <= 1.11, TRL <= 0.24, PEFT <= 0.18.1
and datasets <= 4.0, below the clients autotune's tests use, and imports torchaudio (2.11 on
PyPI, which loads with torch 2.11, not with torch 2.13's CPU build): run this with a Python of
its own where ``pip install llamafactory torch==2.11.*`` resolved them, beside autotune's own
dependencies, and this repository on ``PYTHONPATH``.

In a temporary folder it saves a tiny Llama with a word-level tokenizer and 256 alpaca-format
examples (``dataset_info.json`` naming them), a DeepSpeed config shaped like LLaMA-Factory's
``examples/deepspeed/ds_z2_config.json`` (``"auto"`` everywhere the HF Trainer fills in,
ZeRO-2) and a LoRA SFT YAML naming it with ``deepspeed:``; then

1. ``autotune run -n N -- -m llamafactory.launcher sft.yaml per_device_train_batch_size=2``
   (the entry ``llamafactory-cli train`` runs in each rank), a short search;
2. the training command it printed (``autotune exec --nproc N -- -m llamafactory.launcher
   sft.yaml per_device_train_batch_size=M deepspeed=.../ds_config_optimal.json``).

The table: each experiment's status and micro-batch (ok only where LLaMA-Factory's Trainer built
its engine with the experiment's stage, micro-batch and accumulation), the command printed and
whether it trained.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]


def _prepared(folder: Path) -> Path:
    """The model, the data and the configs in ``folder``; the YAML's path."""
    from tests.hf.sft_data import save_sft_checkpoint

    save_sft_checkpoint(folder)
    lines = (folder / "data" / "train.jsonl").read_text().splitlines()
    examples = [
        {"instruction": "count on", "input": "", "output": json.loads(line)["text"]}
        for line in lines
    ]
    (folder / "data" / "counting.json").write_text(json.dumps(examples))
    (folder / "data" / "dataset_info.json").write_text(
        json.dumps({"counting": {"file_name": "counting.json"}})
    )
    ds = folder / "ds_z2_config.json"
    ds.write_text(
        json.dumps(
            {
                "train_batch_size": "auto",
                "train_micro_batch_size_per_gpu": "auto",
                "gradient_accumulation_steps": "auto",
                "gradient_clipping": "auto",
                "zero_allow_untested_optimizer": True,
                "fp16": {"enabled": "auto", "loss_scale": 0, "initial_scale_power": 16},
                "bf16": {"enabled": "auto"},
                "zero_optimization": {
                    "stage": 2,
                    "allgather_partitions": True,
                    "overlap_comm": False,
                    "reduce_scatter": True,
                    "contiguous_gradients": True,
                },
            }
        )
    )
    sft = {
        "model_name_or_path": str(folder / "model"),
        "stage": "sft",
        "do_train": True,
        "finetuning_type": "lora",
        "lora_target": "all",
        "dataset": "counting",
        "dataset_dir": str(folder / "data"),
        "template": "default",
        "cutoff_len": 32,
        "overwrite_cache": True,
        "output_dir": str(folder / "out"),
        "logging_steps": 1,
        "save_strategy": "no",
        "report_to": "none",
        "per_device_train_batch_size": 2,
        "gradient_accumulation_steps": 1,
        "learning_rate": 1.0e-3,
        "max_steps": 6,
        "bf16": False,
        "deepspeed": str(ds),
    }
    path = folder / "sft.yaml"
    path.write_text(yaml.safe_dump(sft))
    return path


def _autotune(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    env = dict(os.environ, PYTHONPATH=path)
    command = [sys.executable, "-m", "autotune", *args]
    return subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, check=False)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--world-size", type=int, default=2)
    parser.add_argument("--num-trials", type=int, default=8)
    parser.add_argument("--out", type=Path, default=ROOT / "results" / "llamafactory_real.json")
    args = parser.parse_args()
    import llamafactory  # this Python must have it

    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        cfg = _prepared(folder)
        results = folder / "results"
        started = time.monotonic()
        tuned = _autotune(
            "run", "-n", str(args.world_size), "--results-dir", str(results), "-q",
            "--num-trials", str(args.num_trials), "--start-profile-step", "2",
            "--end-profile-step", "3", "--", "-m", "llamafactory.launcher", str(cfg),
            "per_device_train_batch_size=2", cwd=folder,
        )  # fmt: skip
        tuning_s = time.monotonic() - started
        print(tuned.stdout[-3000:], tuned.stderr[-2000:], sep="\n")
        records = _records(results)
        command = (results / "cmd_optimal.txt").read_text().strip()
        trained = None
        if command.startswith("autotune exec"):
            done = _autotune(*shlex.split(command)[1:], cwd=folder)
            trained = done.returncode == 0
            print(done.stderr[-2000:])
    print(f"\nLLaMA-Factory {llamafactory.__version__}, world size {args.world_size}, "
          f"tuning {tuning_s:.0f} s (2 shared CPU cores: seconds are not comparable)")  # fmt: skip
    # An experiment is ok only where LLaMA-Factory's Trainer built its engine with the
    # experiment's stage, micro-batch and accumulation (else ClientConfigMismatch).
    print(f"{'experiment':<14} {'status':<7} {'micro':>5}  error")
    for record in records:
        micro = record["ds_config"]["train_micro_batch_size_per_gpu"]
        error = (record.get("error") or "")[:100]
        print(f"{record['name']:<14} {record['status']:<7} {micro:>5}  {error}")
    print(f"command: {command}\ntrained with it: {trained}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(
        json.dumps(
            {
                "llamafactory": llamafactory.__version__,
                "world_size": args.world_size,
                "tuning_s": tuning_s,
                "experiments": [
                    {k: r.get(k) for k in ("name", "status", "error")} for r in records
                ],
                "command": command,
                "trained": trained,
            },
            indent=2,
        )
    )


def _records(results: Path) -> list[dict[str, Any]]:
    from autotune.results import ResultsDir

    if not results.is_dir():
        return []
    return list(ResultsDir(results).records())


if __name__ == "__main__":
    main()
