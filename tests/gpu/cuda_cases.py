"""What the GPU tests share: the skip, a one-rank NCCL group, GPT training on the engine, and
where measurements go for ``experiments/gpu_check.sh``'s report.

Every test module under ``tests/gpu`` sets ``pytestmark = NEEDS_CUDA``: marked ``gpu``, and
skipped (never an error) where CUDA is not available, as on CI.
"""

from __future__ import annotations

import gc
import json
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist

from autotune.engine import initialize
from autotune.workloads import resolve_workload

NEEDS_CUDA = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]

# Big enough that kernels take longer than launching them (so a missing stream wait would
# show), small enough for seconds per test.
GPU_GPT = {"n_layer": 4, "d_model": 512, "n_head": 8, "seq_len": 256, "vocab": 8192}
_LOSSY = {"atol": 3e-2, "rtol": 3e-2}  # bf16 / fp16 weights against the fp32 reference
# Per precision: the config's extra keys and the tolerance against the fp32 reference.
PRECISIONS: dict[str, tuple[dict[str, Any], dict[str, float]]] = {
    "fp32": ({}, {}),
    "bf16": ({"bf16": {"enabled": True}}, _LOSSY),
    # Dynamic loss scaling from a moderate 2^8, so step one does not overflow.
    "fp16": ({"fp16": {"enabled": True, "initial_scale_power": 8}}, _LOSSY),
}
# Where tests leave measurements for the check's report (unset: nowhere).
REPORT_DIR_ENV = "AUTOTUNE_GPU_REPORT_DIR"


@contextmanager
def nccl_group(world_size: int = 1, rank: int = 0) -> Iterator[None]:
    """The default process group over NCCL, on GPU ``rank``, for the duration."""
    torch.cuda.set_device(rank)
    with tempfile.TemporaryDirectory() as folder:
        dist.init_process_group(
            "nccl",
            init_method=f"file://{folder}/init",
            rank=rank,
            world_size=world_size,
        )
        try:
            yield
        finally:
            dist.destroy_process_group()


@contextmanager
def deterministic_kernels() -> Iterator[None]:
    """CUDA kernels that give the same bits every run (attention by its math backend; the
    rest as ``torch.use_deterministic_algorithms`` picks), so runs can be compared exactly."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    before = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True, warn_only=True)
    try:
        with sdpa_kernel(SDPBackend.MATH):
            yield
    finally:
        torch.use_deterministic_algorithms(before)


def largest_difference(ours: dict[str, torch.Tensor], theirs: dict[str, torch.Tensor]) -> float:
    return max(float((ours[k].float() - v.float()).abs().max()) for k, v in theirs.items())


def fresh_allocator() -> int:
    """Drop what earlier tests left in the CUDA cache; the bytes still allocated."""
    gc.collect()
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    return int(torch.cuda.memory_allocated())


def train_gpt(
    zero: dict[str, Any],
    micro: int = 4,
    steps: int = 3,
    precision: str = "fp32",
    workload_args: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Train the gpt workload on this rank's GPU for ``steps`` steps of ``micro`` samples.

    Returns the final weights (CPU), the losses, the engine's peak and the allocator's, and
    the bytes allocated before the model was built (what the peak sits on).
    """
    baseline = fresh_allocator()
    workload = resolve_workload("gpt", workload_args or GPU_GPT, seed=0)
    num_params = sum(p.numel() for p in workload.model.parameters())  # before stage 3 shards
    config: dict[str, Any] = {
        "train_micro_batch_size_per_gpu": micro,
        "gradient_accumulation_steps": 1,
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
        "zero_optimization": zero,
    }
    if precision != "fp32":
        config[precision] = {"enabled": True}
    engine, _, _, _ = initialize(model=workload.model, config=config)
    generator = torch.Generator(device=engine.device).manual_seed(1 + dist.get_rank())
    losses = []
    for _ in range(steps):
        loss = engine(*workload.make_batch(micro, generator))
        engine.backward(loss)
        engine.step()
        losses.append(float(loss.detach()))
    torch.cuda.synchronize()
    result = {
        "state": engine.module_state_dict(),
        "losses": losses,
        "engine_peak": engine.peak_memory_bytes(),
        "allocator_peak": int(torch.cuda.max_memory_allocated()),
        "baseline": baseline,
        "num_params": num_params,
    }
    del engine, workload
    return result


def record(name: str, data: Any) -> None:
    """Write ``data`` as ``<name>.json`` into the report folder, if the check gave one."""
    folder = os.environ.get(REPORT_DIR_ENV)
    if folder:
        Path(folder).mkdir(parents=True, exist_ok=True)
        (Path(folder) / f"{name}.json").write_text(json.dumps(data, indent=2) + "\n")
