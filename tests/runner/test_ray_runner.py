"""Experiments end to end on warm Ray actors (the real run_rank): every status, and that the
actors a failure leaves behind measure like fresh ones.

All tests share one runner, so they also show that the pool survives each failure kind.
"""

from __future__ import annotations

import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from autotune.experiment import ExperimentResult, Status
from autotune.runner.ray_gang import ActorInfo
from autotune.runner.ray_runner import RayRunner
from tests.runner.specs import FAULTY, spec

pytestmark = pytest.mark.ray

# Warm actors after an experiment, relative to after their first one (torch and the engine
# loaded). Measured here: a few MiB once release_memory runs.
RSS_GROWTH_BOUND_BYTES = 64 << 20
# Threads an idle actor may gain over its baseline (Ray's own come and go).
THREAD_GROWTH_BOUND = 4
LEAK_SIZED_GPT = {"n_layer": 2, "d_model": 256, "n_head": 4, "seq_len": 64, "vocab": 4096}


@pytest.fixture(scope="module")
def runner(ray_cluster: str) -> Iterator[RayRunner]:
    with RayRunner() as runner:
        yield runner


@pytest.fixture(scope="module")
def baseline(runner: RayRunner) -> list[ActorInfo]:
    """The warm actors after a first clean experiment."""
    assert runner.run(spec("warm-up")).ok
    return runner.actors()


def pids(runner: RayRunner) -> set[int]:
    return {actor.pid for actor in runner.actors()}


def assert_clean_run(runner: RayRunner, baseline: list[ActorInfo]) -> ExperimentResult:
    """The next experiment succeeds and leaves its actors as lean as the baseline ones."""
    result = runner.run(spec("after"))
    assert result.status is Status.ok, result.error_detail
    before = max(a.rss_bytes for a in baseline)
    threads = max(a.num_threads for a in baseline)
    actors = runner.actors()
    assert len(actors) == 2
    for actor in actors:
        assert not actor.process_group_initialized
        assert actor.rss_bytes <= before + RSS_GROWTH_BOUND_BYTES, (actor, before)
        assert actor.num_threads <= threads + THREAD_GROWTH_BOUND, (actor, threads)
    return result


def test_ok_experiments_reuse_the_same_warm_actors(
    runner: RayRunner, baseline: list[ActorInfo]
) -> None:
    first = runner.run(spec("ok-1"))
    warm = pids(runner)
    second = runner.run(spec("ok-2"))
    assert first.ok and second.ok, (first.error_detail, second.error_detail)
    assert pids(runner) == warm == {a.pid for a in baseline}
    metrics = second.metrics
    assert metrics is not None and len(metrics.step_times_s) == 3
    assert metrics.throughput * metrics.latency == pytest.approx(8)
    # Ranks report the Ray node they ran on.
    assert set(second.node_ids) == {a.node_id for a in runner.actors()}
    assert second.timings.total_s >= second.timings.warmup_s + second.timings.window_s


def test_memory_returns_to_baseline_after_every_experiment(
    runner: RayRunner, baseline: list[ActorInfo]
) -> None:
    for stage in (0, 1, 2, 3, 2):
        ds_config = {
            "train_batch_size": 8,
            "train_micro_batch_size_per_gpu": 4,
            "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
            "zero_optimization": {"stage": stage},
        }
        # Big enough that one leaked experiment (~40 MB of weights, gradients and optimizer
        # state per rank) would break the bound.
        result = runner.run(spec(f"stage-{stage}", args=LEAK_SIZED_GPT, ds_config=ds_config))
        assert result.ok, result.error_detail
        for actor in runner.actors():
            growth = actor.rss_bytes - max(a.rss_bytes for a in baseline)
            assert growth <= RSS_GROWTH_BOUND_BYTES, f"stage {stage}: +{growth >> 20} MiB"


def test_an_exception_is_status_error_and_keeps_the_actors(
    runner: RayRunner, baseline: list[ActorInfo]
) -> None:
    warm = pids(runner)
    result = runner.run(spec("raise", FAULTY, {"fault": "raise", "rank_to_fail": 1}))
    assert result.status is Status.error
    assert result.error == "ValueError: deliberate failure on rank 1"
    assert result.failed_rank == 1
    assert result.error_detail is not None and "faulty_workloads.py" in result.error_detail
    # Both ranks reported (no grace period ran out, nothing was killed): the same actors.
    assert pids(runner) == warm
    assert_clean_run(runner, baseline)


def test_an_exception_in_fresh_actors_releases_the_peer_and_keeps_them(
    runner: RayRunner, baseline: list[ActorInfo]
) -> None:
    # Fresh actors, whose first optimizer (importing torch._dynamo) is built while the raising
    # experiment's process group exists: the group must still be closed when rank 1 fails, or
    # rank 0 waits in its collective until the runner gives up on it and replaces the gang.
    runner.release_idle()
    # A first experiment that fails on both ranks before building anything leaves the fresh
    # actors idle, so their pids can be taken.
    missing = runner.run(spec("missing", "tests.runner.faulty_workloads:no_such_workload"))
    assert missing.status is Status.error, missing.error
    fresh = pids(runner)
    assert len(fresh) == 2 and fresh.isdisjoint(a.pid for a in baseline)

    result = runner.run(spec("raise", FAULTY, {"fault": "raise", "rank_to_fail": 1}))
    assert result.error == "ValueError: deliberate failure on rank 1", result.error
    assert pids(runner) == fresh  # rank 0 reported its lost peer: nothing to replace
    assert runner.run(spec("after-fresh")).ok


def test_out_of_memory_is_status_oom_and_keeps_the_actors(
    runner: RayRunner, baseline: list[ActorInfo]
) -> None:
    warm = pids(runner)
    result = runner.run(spec("oom", device_memory_bytes=1 << 20))
    assert result.status is Status.oom, result.error
    assert pids(runner) == warm
    assert_clean_run(runner, baseline)


@pytest.mark.slow
def test_a_hang_is_cut_by_the_timeout_and_its_actors_are_replaced(
    runner: RayRunner, baseline: list[ActorInfo]
) -> None:
    warm = pids(runner)
    hang = spec("hang", FAULTY, {"fault": "sleep", "rank_to_fail": 0}, timeout_s=4)
    result = runner.run(hang)
    assert result.status is Status.timeout, result.error
    assert result.duration_s >= 4  # cut by the timeout, not before it
    after = assert_clean_run(runner, baseline)
    assert pids(runner).isdisjoint(warm)
    assert after.ok


def test_an_actor_that_dies_is_status_error_naming_the_death_and_is_replaced(
    runner: RayRunner, baseline: list[ActorInfo]
) -> None:
    warm = pids(runner)
    result = runner.run(spec("kill", FAULTY, {"fault": "kill", "rank_to_fail": 1}))
    assert result.status is Status.error
    assert result.failed_rank == 1
    assert result.error is not None and result.error.startswith("RankDied: rank 1 actor died")
    assert_clean_run(runner, baseline)
    assert pids(runner).isdisjoint(warm)


def test_user_workload_from_a_module_in_a_temporary_directory(
    runner: RayRunner, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The actors were started before this directory existed: paths travel per experiment.
    (tmp_path / "ray_user_models.py").write_text(
        textwrap.dedent(
            """
            from autotune.workloads import resolve_workload

            def build(n_layer=1):
                return resolve_workload("mlp", {"n_layer": n_layer})
            """
        )
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    result = runner.run(spec("user", "ray_user_models:build", {"n_layer": 2}))
    assert result.status is Status.ok, result.error_detail


def test_an_experiment_that_can_never_be_placed_is_an_error_result(runner: RayRunner) -> None:
    result = runner.run(spec("too-big", cpus_per_rank=8))
    assert result.status is Status.error
    assert result.error is not None and result.error.startswith("PlacementError")
