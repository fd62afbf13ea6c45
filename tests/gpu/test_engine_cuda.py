"""The engine on one GPU over a one-rank NCCL group: every stage and precision against the
single-process reference, overlap_comm on CUDA streams, and memory against the allocator."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import torch

from autotune.config import load_config
from autotune.profiling.model_info import model_info
from autotune.tuner.memory import estimate_memory
from autotune.workloads import resolve_workload
from tests.engine import engine_cases as cases
from tests.gpu.cuda_cases import (
    GPU_GPT,
    NEEDS_CUDA,
    PRECISIONS,
    deterministic_kernels,
    largest_difference,
    nccl_group,
    record,
    train_gpt,
)

pytestmark = NEEDS_CUDA

# The memory estimate's target: within this share of what the allocator measured.
ESTIMATE_TOLERANCE = 0.15


@pytest.fixture(scope="module", autouse=True)
def one_rank_nccl() -> Iterator[None]:
    # TF32 would make the reference and the engine differ by more than ZeRO ever could.
    saved = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    with nccl_group():
        yield
    torch.backends.cuda.matmul.allow_tf32 = saved


@pytest.mark.parametrize("precision", list(PRECISIONS))
@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_matches_single_process_reference(stage: int, precision: str) -> None:
    extra, tolerance = PRECISIONS[precision]
    config = cases.base_config({"stage": stage, **cases.SMALL_BUCKETS}, gas=2, clip=0.5, **extra)
    cases.match_reference(config, **tolerance)


def test_fp16_overflow_skips_and_scales_down() -> None:
    result = cases.fp16_overflow()
    assert result["skipped"] > 0 and not result["changed_on_skip"]
    assert result["scale_after"] < result["scale_before"] and result["finite"]


@pytest.mark.parametrize("stage", [1, 2, 3])
def test_cpu_offload_matches_reference(stage: int) -> None:
    # The optimizer steps on the host; gradients go down and parameters come back up.
    zero = {"stage": stage, **cases.SMALL_BUCKETS, "offload_optimizer": {"device": "cpu"}}
    cases.match_reference(cases.base_config(zero))


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_overlap_comm_gives_the_same_numbers(stage: int) -> None:
    # Small buckets: many reductions launched from backward hooks on NCCL's stream while
    # backward's kernels run on the compute stream; a missing wait would change the weights.
    zero = {"stage": stage, "reduce_bucket_size": 200_000, "allgather_bucket_size": 200_000}
    with deterministic_kernels():
        off = train_gpt({**zero, "overlap_comm": False})
        again = train_gpt({**zero, "overlap_comm": False})
        on = train_gpt({**zero, "overlap_comm": True})
    # Bit for bit where the same run twice is; else no further from off than off is from itself.
    spread = largest_difference(off["state"], again["state"])
    assert largest_difference(on["state"], off["state"]) <= 4 * spread, spread


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_reported_peak_is_the_allocators(stage: int) -> None:
    run = train_gpt({"stage": stage}, steps=2)
    assert run["engine_peak"] == run["allocator_peak"] > run["baseline"]


def test_memory_estimate_against_the_allocator() -> None:
    """The tuner's estimate (model states, buffers, activations) against the measured peak,
    per stage at three micro-batches; the table goes into the check's report.

    On an H100 (2026-11-26) it was within 2.1% everywhere once activations counted backward's
    gradients in flight; counting only the tensors saved for backward it was 16% short at
    micro-batch 8, and the shortfall grows with the micro-batch."""
    info = model_info(resolve_workload("gpt", GPU_GPT, seed=0), 1)
    budget = int(torch.cuda.get_device_properties(0).total_memory)
    rows: list[dict[str, Any]] = []
    for stage in (0, 1, 2, 3):
        for micro in (2, 4, 8):
            config = {
                "train_micro_batch_size_per_gpu": micro,
                "zero_optimization": {"stage": stage},
            }
            estimate = estimate_memory(info, load_config(config, 1), stage, False, budget)
            run = train_gpt({"stage": stage}, micro=micro, steps=2)
            measured = run["allocator_peak"] - run["baseline"]
            estimated = estimate.bytes_at(micro)
            rows.append(
                {
                    "stage": stage,
                    "micro_batch": micro,
                    "estimated_bytes": estimated,
                    "measured_bytes": measured,
                    "error": estimated / measured - 1.0,
                }
            )
    record("memory_estimate", {"workload": GPU_GPT, "rows": rows})
    worst = max(rows, key=lambda row: abs(row["error"]))
    assert abs(worst["error"]) <= ESTIMATE_TOLERANCE, worst
