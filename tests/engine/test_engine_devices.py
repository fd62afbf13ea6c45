"""The engine's device handling, checked on CPU: a group of one rank (what every runner makes
for ``--world-size 1``), and the CUDA calls made in the right order (with stand-ins)."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from typing import Any

import pytest
import torch
import torch.distributed as dist

from autotune.engine import collectives, launch
from autotune.engine.memory_tracker import MemoryTracker
from autotune.runner import rank
from tests.engine import engine_cases as cases


@pytest.fixture
def one_rank_gloo() -> Iterator[None]:
    with tempfile.TemporaryDirectory() as folder:
        dist.init_process_group("gloo", init_method=f"file://{folder}/init", rank=0, world_size=1)
        try:
            yield
        finally:
            dist.destroy_process_group()


@pytest.mark.usefixtures("one_rank_gloo")
@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_a_group_of_one_rank_matches_the_reference(stage: int) -> None:
    # gloo's reduce-scatter exchange once summed "the other ranks' rows" and had none.
    cases.match_reference(cases.base_config({"stage": stage, **cases.SMALL_BUCKETS}, gas=2))


def test_cuda_tracker_starts_from_a_fresh_allocator_peak(monkeypatch: pytest.MonkeyPatch) -> None:
    # The allocator's peak is per process: a warm process's next engine must not report the
    # last one's (an out-of-memory experiment's, say).
    resets: list[torch.device] = []
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", resets.append)
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda device: 123)
    tracker = MemoryTracker(torch.device("cuda", 0), budget_bytes=100)
    assert resets == [torch.device("cuda", 0)]
    assert tracker.peak_bytes() == 123 and tracker.exceeded()


def test_torchrun_on_gpus_picks_the_local_gpu_before_nccl_starts(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls: list[Any] = []
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setattr(dist, "is_initialized", lambda: False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: calls[-1][1])
    monkeypatch.setattr(torch.cuda, "set_device", lambda device: calls.append(("gpu", device)))
    monkeypatch.setattr(
        dist, "init_process_group", lambda backend, **kw: calls.append(("init", backend))
    )
    launch.resolve_group(None)
    assert calls == [("gpu", 1), ("init", "nccl")]


@pytest.mark.parametrize(("local_rank", "gpu"), [("3", 1), (None, 0)])
def test_a_rank_takes_the_gpu_its_launcher_named(
    monkeypatch: pytest.MonkeyPatch, local_rank: str | None, gpu: int
) -> None:
    # A DeepSpeed script may start NCCL itself and leave the GPU to the engine, as
    # DeepSpeed's engine takes LOCAL_RANK's; without one the current device stays.
    current = [0]
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    if local_rank is not None:
        monkeypatch.setenv("LOCAL_RANK", local_rank)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "set_device", lambda device: current.__setitem__(0, device))
    monkeypatch.setattr(torch.cuda, "current_device", lambda: current[0])
    assert collectives.local_cuda_device() == torch.device("cuda", gpu)


def test_a_finished_rank_collects_garbage_before_emptying_the_cuda_cache(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Blocks of tensors caught in reference cycles reach the cache only once collected.
    calls: list[str] = []
    monkeypatch.setattr(rank.gc, "collect", lambda: calls.append("collect"))
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: calls.append("empty_cache"))
    rank.release_memory()
    assert calls == ["collect", "empty_cache"]
