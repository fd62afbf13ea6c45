"""The engine on two GPUs over NCCL (where two exist): every stage and precision against the
single-process reference, NCCL's own collectives, overlap_comm on and off."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

from tests.engine import engine_cases as cases
from tests.engine.rank_pool import RankPool
from tests.gpu.cuda_cases import NEEDS_CUDA, PRECISIONS

pytestmark = [
    *NEEDS_CUDA,
    pytest.mark.multirank,
    pytest.mark.skipif(
        not torch.cuda.is_available() or torch.cuda.device_count() < 2,
        reason="needs 2 GPUs",
    ),
]


@pytest.fixture(scope="module")
def pool() -> Iterator[RankPool]:
    ranks = RankPool(world_size=2, backend="nccl")
    yield ranks
    ranks.close()


@pytest.mark.parametrize("precision", list(PRECISIONS))
@pytest.mark.parametrize("stage", [0, 1, 2, 3])
@pytest.mark.parametrize("overlap", [True, False])
def test_matches_single_process_reference(
    pool: RankPool, stage: int, precision: str, overlap: bool
) -> None:
    extra, tolerance = PRECISIONS[precision]
    zero = {"stage": stage, "overlap_comm": overlap, **cases.SMALL_BUCKETS}
    config = cases.base_config(zero, gas=2, clip=0.5, **extra)
    pool.run(cases.match_reference, config, **tolerance)


@pytest.mark.parametrize("stage", [1, 2, 3])
def test_knob_variants_still_match(pool: RankPool, stage: int) -> None:
    zero = {
        "stage": stage,
        **cases.SMALL_BUCKETS,
        "reduce_scatter": False,
        "allgather_partitions": False,
        "contiguous_gradients": False,
        "stage3_max_reuse_distance": 0,
    }
    pool.run(cases.match_reference, cases.base_config(zero, gas=2))


def test_overlap_comm_gives_the_same_numbers(pool: RankPool) -> None:
    for stage in (0, 1, 2, 3):
        runs = [
            pool.run(
                cases.match_reference,
                cases.base_config({"stage": stage, "overlap_comm": overlap, **cases.SMALL_BUCKETS}),
            )
            for overlap in (True, False)
        ]
        # The same largest difference from the reference on each rank, to kernel noise.
        assert runs[0] == pytest.approx(runs[1], abs=1e-6), stage


def test_fp16_overflow_skips_and_scales_down(pool: RankPool) -> None:
    for result in pool.run(cases.fp16_overflow):
        assert result["skipped"] > 0 and not result["changed_on_skip"]
        assert result["scale_after"] < result["scale_before"] and result["finite"]
