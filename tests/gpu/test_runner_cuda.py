"""Experiments on the GPU: a real CUDA out-of-memory in a warm process, and a short tuning run
with the local runner."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import torch

from autotune.experiment import ExperimentSpec, Status
from autotune.results import ResultsDir
from autotune.runner import free_port, run_local, run_rank
from tests.gpu.cuda_cases import GPU_GPT, NEEDS_CUDA, fresh_allocator, record
from tests.specs import job_spec

pytestmark = NEEDS_CUDA

REPO = Path(__file__).resolve().parents[2]


def gpt_spec(name: str, micro: int) -> ExperimentSpec:
    return job_spec(
        name,
        {
            "train_batch_size": micro,
            "train_micro_batch_size_per_gpu": micro,
            "gradient_accumulation_steps": 1,
            "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
            "zero_optimization": {"stage": 2},
        },
        workload_args=GPU_GPT,
        world_size=1,
        start_profile_step=3,
        end_profile_step=6,
        timeout_s=300.0,
        flops_per_sample=1.0,  # not what is tested: skips counting FLOPs
    )


def run_here(spec: ExperimentSpec) -> Any:
    """One rank of ``spec`` in this (warm) process, as a Ray actor runs it."""
    return run_rank(spec, 0, f"tcp://127.0.0.1:{free_port()}")


def test_a_real_oom_in_a_warm_process_is_released_and_the_next_experiment_measures_fresh() -> None:
    normal = gpt_spec("normal", micro=8)
    before = run_here(normal)
    assert before.status is Status.ok, before.error_detail
    # What an experiment leaves for good (library workspaces such as cuBLAS's), measured
    # after one: the out-of-memory experiment may leave nothing beyond it.
    settled = fresh_allocator()
    # Logits alone (micro x seq x vocab x 4 bytes) of twice the GPU: out of memory mid-forward.
    total = torch.cuda.get_device_properties(0).total_memory
    per_sample = GPU_GPT["seq_len"] * GPU_GPT["vocab"] * 4
    huge = run_here(gpt_spec("huge", micro=int(2 * total // per_sample) + 1))
    assert huge.status is Status.oom, huge.error
    assert torch.cuda.memory_allocated() == settled  # nothing of it is still held
    assert torch.cuda.memory_reserved() - settled < 64 << 20  # and the cache was emptied

    after = run_here(normal)
    fresh = run_local(normal)  # a fresh process
    assert after.status is Status.ok and fresh.status is Status.ok, (after.error, fresh.error)
    assert fresh.metrics is not None
    peaks = {
        "warm_before_oom": before.metrics["peak_memory_bytes"],
        "warm_after_oom": after.metrics["peak_memory_bytes"],
        "fresh_process": fresh.metrics.peak_memory_bytes,
    }
    record(
        "warm_oom",
        {
            "oom_error": huge.error,
            "settled_bytes": settled,
            "peak_bytes": peaks,
            # Reported, not asserted: timings are the benchmark's business.
            "throughput": {
                "warm_before_oom": before.metrics["throughput"],
                "warm_after_oom": after.metrics["throughput"],
                "fresh_process": fresh.metrics.throughput,
            },
        },
    )
    # The engine's peak starts from its own construction: not the huge one's.
    assert abs(peaks["warm_after_oom"] - peaks["warm_before_oom"]) <= 0.01 * peaks["fresh_process"]
    # A fresh process allocates its workspaces inside the experiment, a warm one before it.
    assert abs(peaks["warm_after_oom"] - peaks["fresh_process"]) <= 0.1 * peaks["fresh_process"]


def test_a_short_tuning_run_with_the_local_runner_ends_with_an_optimal_config(
    tmp_path: Path,
) -> None:
    args = [part for key, value in GPU_GPT.items() for part in ("-a", f"{key}={value}")]
    command = [
        sys.executable, "-m", "autotune", "run", "--runner", "local", "--world-size", "1",
        "--workload", "gpt", *args, "--num-trials", "6", "--start-profile-step", "3",
        "--end-profile-step", "5", "--results-dir", str(tmp_path / "run"), "--quiet",
    ]  # fmt: skip
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
    }
    done = subprocess.run(
        command, capture_output=True, text=True, env=env, timeout=600, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    optimal = tmp_path / "run" / "ds_config_optimal.json"
    assert optimal.is_file(), done.stdout[-3000:]
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    record("tuning_run", {"stdout": done.stdout[-4000:], "summary": summary})
    statuses = [record["status"] for record in ResultsDir(tmp_path / "run").records()]
    assert "ok" in statuses and "error" not in statuses, statuses
