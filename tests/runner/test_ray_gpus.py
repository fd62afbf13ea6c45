"""GPU placement on a GPU cluster, checked once before any experiment, and Ray's memory
monitor as status oom. Fake cluster resources stand in for GPUs: no Ray is started here
except by the one test marked ``ray``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import ray
from typer.testing import CliRunner

from autotune.cli import app
from autotune.config import ConfigError
from autotune.experiment import Status
from autotune.runner import ray_runner
from autotune.runner.ray_experiment import RunningExperiment
from autotune.runner.ray_gang import DriverPaths, GangShape
from autotune.runner.ray_runner import RayRunner, check_gpus_fit
from tests.runner.specs import stand_in

TWO_GPUS = {"CPU": 16.0, "GPU": 2.0}


@pytest.mark.parametrize(
    ("world_size", "gpus_per_rank", "cluster_gpus"),
    [(2, 1.0, 2.0), (4, 0.5, 2.0), (3, 0.1, 0.3), (8, 0.0, 0.0)],
)
def test_ranks_that_fit_the_clusters_gpus_pass(
    world_size: int, gpus_per_rank: float, cluster_gpus: float
) -> None:
    check_gpus_fit(world_size, gpus_per_rank, cluster_gpus)


def test_more_ranks_than_gpus_names_the_numbers_and_the_ways_out() -> None:
    with pytest.raises(ConfigError) as caught:
        check_gpus_fit(4, 1.0, 2.0)
    assert str(caught.value) == (
        "world_size: 4 ranks need 4 GPUs (1 per rank) but the Ray cluster has 2; use a world "
        "size of at most 2, or gpus_per_rank=0 (--gpus-per-rank 0) to run the ranks without "
        "GPUs"
    )


def test_gpus_asked_for_on_a_cluster_without_any_suggests_only_gpus_per_rank_0() -> None:
    with pytest.raises(ConfigError, match=r"has 0; use gpus_per_rank=0 \(--gpus-per-rank 0\)"):
        check_gpus_fit(2, 1.0, 0.0)


@pytest.fixture
def fake_gpu_cluster(monkeypatch: pytest.MonkeyPatch) -> None:
    """Ray "connected" to a 2-GPU cluster that does not exist: nothing may be placed on it."""

    def no_gang(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("a gang was started despite the GPU check")

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setattr(ray_runner, "connect_ray", lambda *args: False)
    monkeypatch.setattr(ray, "cluster_resources", lambda: dict(TWO_GPUS))
    monkeypatch.setattr(ray_runner, "Gang", no_gang)


@pytest.mark.usefixtures("fake_gpu_cluster")
def test_the_default_gpu_per_rank_is_checked_before_the_first_experiment() -> None:
    with RayRunner() as runner:
        results = runner.run_many([stand_in("fits", world_size=2), stand_in("big", world_size=4)])
        with pytest.raises(ConfigError, match="4 ranks need 4 GPUs"):
            next(results)


@pytest.mark.usefixtures("fake_gpu_cluster")
def test_the_cli_reports_too_few_gpus_in_one_line_with_exit_code_2(tmp_path: Path) -> None:
    args = ["run", "-n", "4", "--workload", "mlp", "--results-dir", str(tmp_path), "-q"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2, result.output
    assert result.stderr.strip().splitlines() == [
        "error: world_size: 4 ranks need 4 GPUs (1 per rank) but the Ray cluster has 2; use a "
        "world size of at most 2, or gpus_per_rank=0 (--gpus-per-rank 0) to run the ranks "
        "without GPUs"
    ]
    assert "Traceback" not in result.output


@pytest.mark.ray
def test_gpus_per_rank_on_a_cluster_without_gpus_raises(ray_cluster: str) -> None:
    with RayRunner(gpus_per_rank=1) as runner, pytest.raises(ConfigError, match="has 0"):
        runner.run(stand_in("gpu", world_size=2))


class _FakeGang:
    def node_id(self, rank: int) -> str:
        return f"node-{rank}"


def test_an_actor_killed_by_rays_memory_monitor_is_status_oom(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The memory monitor cannot be provoked safely on a test machine: ray.get answers as it
    # does after the monitor killed the rank's actor.
    def killed_by_memory_monitor(future: Any) -> Any:
        raise ray.exceptions.OutOfMemoryError("Task was killed due to the node running low")

    monkeypatch.setattr(ray, "get", killed_by_memory_monitor)
    experiment = object.__new__(RunningExperiment)
    experiment.gang, experiment.gang_broken = _FakeGang(), False
    outcome = experiment._collect(1, future=None)
    assert outcome.status is Status.oom and not outcome.peer_failure
    assert outcome.error is not None and "Ray's memory monitor" in outcome.error
    assert outcome.node_id == "node-1" and experiment.gang_broken


@pytest.mark.usefixtures("fake_gpu_cluster")
def test_gpus_per_rank_0_from_the_cli_lets_any_world_size_through() -> None:
    from autotune.cli import RunnerKind, _make_runner

    with _make_runner(RunnerKind.ray, None, 0.0) as runner:
        assert runner._gpus_per_rank == 0.0


@pytest.mark.parametrize(("gpus_per_rank", "hidden"), [(0.0, True), (1.0, False)])
def test_ranks_without_gpus_see_none(
    monkeypatch: pytest.MonkeyPatch, gpus_per_rank: float, hidden: bool
) -> None:
    # A rank that sees a GPU takes it for NCCL: CPU ranks on a GPU node must not see one.
    made: list[dict[str, str]] = []
    monkeypatch.setattr(ray_runner, "take_parked", lambda shape, kind: None)
    monkeypatch.setattr(ray_runner, "Gang", lambda shape, kind: made.append(dict(kind.env_vars)))
    runner = object.__new__(RayRunner)
    runner._rank_fn, runner._strategy, runner._preload_torch = None, "PACK", True
    runner._reserve_port, runner._worker_paths = None, ()
    runner._make_gang(GangShape(2, 1, gpus_per_rank))
    assert (made[0].get("CUDA_VISIBLE_DEVICES") == "") is hidden


@pytest.mark.parametrize("known_to_workers", [True, False])
def test_actors_get_the_drivers_paths_in_a_runtime_env_only_where_workers_lack_them(
    monkeypatch: pytest.MonkeyPatch, known_to_workers: bool
) -> None:
    # A runtime_env of its own costs an actor a worker started for it (seconds): only where
    # Ray's workers do not already import from the driver's paths (a cluster started
    # elsewhere, or paths the driver added since it started this one).
    made: list[object] = []
    monkeypatch.setattr(ray_runner, "take_parked", lambda shape, kind: None)
    monkeypatch.setattr(ray_runner, "Gang", lambda shape, kind: made.append(kind.python_path))
    runner = object.__new__(RayRunner)
    runner._rank_fn, runner._strategy, runner._preload_torch = None, "PACK", True
    paths = DriverPaths.capture().sys_path
    runner._reserve_port, runner._worker_paths = None, paths if known_to_workers else ()
    runner._make_gang(GangShape(2, 1, 0.0))
    assert made == [None if known_to_workers else paths]


def test_keep_warm_from_the_environment_takes_1_or_0_and_refuses_anything_else(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for value, keep in [("1", True), ("0", False), ("", False)]:
        monkeypatch.setenv("AUTOTUNE_RAY_KEEP_WARM", value)
        assert ray_runner._keep_warm_from_env() is keep
    monkeypatch.setenv("AUTOTUNE_RAY_KEEP_WARM", "yes")
    with pytest.raises(ConfigError, match="AUTOTUNE_RAY_KEEP_WARM: 'yes' is neither 1"):
        ray_runner._keep_warm_from_env()
