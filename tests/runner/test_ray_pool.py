"""The Ray pool's mechanics with a stand-in for run_rank: side by side, eviction, deaths
between experiments, and that the driver stopping (exception, Ctrl-C) stops its actors."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from dataclasses import replace
from datetime import datetime
from pathlib import Path

import pytest

from autotune.experiment import ExperimentResult, ExperimentSpec, Status
from autotune.runner.outcome import RankOutcome
from autotune.runner.ray_runner import RayRunner
from tests.cli_process import alive
from tests.runner.specs import stand_in, stand_in_rank

pytestmark = pytest.mark.ray
ROOT = Path(__file__).resolve().parents[2]


class SlowToStart:
    """``stand_in_rank`` in an actor that takes ``start_s`` to start: it is unpickled there,
    before the actor's constructor runs, and sleeps as it is."""

    def __init__(self, start_s: float) -> None:
        self.start_s = start_s

    def __reduce__(self) -> tuple[object, tuple[float]]:
        return _slow_to_unpickle, (self.start_s,)

    def __call__(self, spec: ExperimentSpec, rank: int, init_method: str) -> RankOutcome:
        return stand_in_rank(spec, rank, init_method)


def _slow_to_unpickle(start_s: float) -> SlowToStart:
    time.sleep(start_s)
    return SlowToStart(start_s)


class FailsToStart:
    """``stand_in_rank`` in an actor whose start raises, as unpickling it does there: what an
    actor meets when its worker imports another ``autotune`` than the driver's."""

    def __reduce__(self) -> tuple[object, tuple[()]]:
        return _fail_to_unpickle, ()

    def __call__(self, spec: ExperimentSpec, rank: int, init_method: str) -> RankOutcome:
        return stand_in_rank(spec, rank, init_method)


def _fail_to_unpickle() -> FailsToStart:
    raise ModuleNotFoundError("No module named 'autotune.results.files'")


def wait_for(condition: object, timeout_s: float = 15.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if callable(condition) and condition():
            return True
        time.sleep(0.1)
    return False


@pytest.fixture(scope="module")
def runner(ray_cluster: str) -> Iterator[RayRunner]:
    # Ranks that only sleep need no torch: each new gang starts without importing it.
    with RayRunner(rank_fn=stand_in_rank, preload_torch=False) as runner:
        yield runner


def warm_two_single_rank_gangs(runner: RayRunner) -> None:
    assert all(r.ok for r in runner.run_many([stand_in("warm-a"), stand_in("warm-b")]))


def test_independent_experiments_run_side_by_side(runner: RayRunner) -> None:
    warm_two_single_rank_gangs(runner)
    results = list(runner.run_many([stand_in("a", sleep_s=3), stand_in("b", sleep_s=3)]))
    assert [r.status for r in results] == [Status.ok, Status.ok]
    (a_start, a_end), (b_start, b_end) = (interval(r) for r in results)
    assert a_start < b_end and b_start < a_end, "the two experiments ran one after the other"


def interval(result: ExperimentResult) -> tuple[float, float]:
    """When an experiment ran, in seconds since the epoch."""
    start = datetime.fromisoformat(result.started_at).timestamp()
    return start, start + result.duration_s


def test_an_exception_in_the_driver_stops_the_running_actors(
    runner: RayRunner, tmp_path: Path
) -> None:
    warm_two_single_rank_gangs(runner)
    specs = [stand_in("short", sleep_s=1), stand_in("long", sleep_s=600, pid_dir=str(tmp_path))]
    with pytest.raises(RuntimeError, match="the driver fails"):
        for _ in runner.run_many(specs):
            raise RuntimeError("the driver fails")
    long_pid = int((tmp_path / "long-0").read_text())
    assert wait_for(lambda: not alive(long_pid)), "the running experiment's actor lives on"
    assert len(runner.actors()) == 1  # the short experiment's gang is still warm


def test_an_idle_gang_of_another_shape_makes_room(runner: RayRunner) -> None:
    assert runner.run(stand_in("two-ranks", world_size=2)).ok  # holds both CPUs, idle
    one = runner.run(stand_in("one-rank", world_size=1))
    assert one.ok, one.error
    assert [a.world_size for a in runner.actors()] == [1]


def test_an_actor_that_died_while_idle_is_replaced_and_its_experiment_run_again(
    runner: RayRunner,
) -> None:
    assert runner.run(stand_in("warm", world_size=2)).ok
    victim = next(a.pid for a in runner.actors() if a.rank == 0 and a.world_size == 2)
    os.kill(victim, signal.SIGKILL)
    assert wait_for(lambda: not alive(victim))
    # Lost before the experiment began: not the experiment's failure (issue 34).
    result = runner.run(stand_in("after-death", world_size=2))
    assert result.status is Status.ok, result.error
    assert result.infrastructure_retries == 1
    assert victim not in {a.pid for a in runner.actors()}


def test_an_actor_whose_start_raises_says_what_it_raised_on_one_line(
    runner: RayRunner,
) -> None:
    runner.release_idle()
    with RayRunner(rank_fn=FailsToStart(), preload_torch=False) as broken:
        # Side by side: each is tried as often as an infrastructure failure allows.
        results = {r.name: r for r in broken.run_many([stand_in("broken-a"), stand_in("broken-b")])}
    first, second = results["broken-a"], results["broken-b"]
    assert first.status is Status.error and first.error is not None
    cause = "its start raised ModuleNotFoundError: No module named 'autotune.results.files'"
    assert first.error.startswith("infrastructure: RankLost: rank 0 actor") and cause in first.error
    # One line, without Ray's colours or the actor's ids: two such failures read alike.
    assert "\n" not in first.error and "\x1b" not in first.error and "actor_id" not in first.error
    assert second.error == first.error
    assert first.error_detail is not None and "\x1b" not in first.error_detail


def test_a_new_gangs_start_up_does_not_count_against_the_timeout(runner: RayRunner) -> None:
    runner.release_idle()  # the runner below needs a CPU this module's runner may hold
    with RayRunner(rank_fn=SlowToStart(4.0), preload_torch=False) as slow:
        result = slow.run(stand_in("after-a-slow-start", timeout_s=2))
    assert result.status is Status.ok, result.error
    assert result.duration_s >= 4  # the start-up is still the experiment's wall time


def test_a_gang_that_never_starts_is_a_failed_experiment(runner: RayRunner) -> None:
    runner.release_idle()
    with RayRunner(
        rank_fn=SlowToStart(600.0), preload_torch=False, actor_start_timeout_s=3
    ) as never:
        result = never.run(stand_in("never-starts", timeout_s=600))
    assert result.status is Status.error
    assert result.error == "RankStartError: the rank actors had not started within 3 s"


_CTRL_C_DRIVER = """
import sys, time
from autotune.runner.ray_runner import RayRunner
from tests.runner.specs import stand_in, stand_in_rank

try:
    with RayRunner(rank_fn=stand_in_rank, preload_torch=False) as runner:
        list(runner.run_many([stand_in("long", sleep_s=600, pid_dir=sys.argv[1])]))
except KeyboardInterrupt:
    print("interrupted", flush=True)
    time.sleep(600)  # the driver lives on: only the runner can have stopped the actor
"""


def test_ctrl_c_in_the_driver_stops_its_actors(
    runner: RayRunner, ray_cluster: str, tmp_path: Path
) -> None:
    runner.release_idle()  # the driver below needs a CPU this module's runner may hold
    env = {**os.environ, "RAY_ADDRESS": ray_cluster, "PYTHONPATH": str(ROOT)}
    driver = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(_CTRL_C_DRIVER), str(tmp_path)],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert wait_for(lambda: (tmp_path / "long-0").exists(), timeout_s=60)
        actor_pid = int((tmp_path / "long-0").read_text())
        driver.send_signal(signal.SIGINT)
        assert driver.stdout is not None
        assert driver.stdout.readline().strip() == "interrupted"
        assert wait_for(lambda: not alive(actor_pid)), "the actor outlived Ctrl-C"
        assert driver.poll() is None
    finally:
        driver.kill()
        driver.wait()


def test_a_prestarted_gang_runs_the_first_experiment_of_its_shape(
    runner: RayRunner, tmp_path: Path
) -> None:
    runner.release_idle()  # the runner below needs the CPUs this module's runner may hold
    with RayRunner(rank_fn=stand_in_rank, preload_torch=False) as fresh:
        fresh.prestart(world_size=2)  # returns at once: the gang starts in the background
        assert wait_for(lambda: len(fresh.actors()) == 2, timeout_s=60)
        prestarted = {actor.pid for actor in fresh.actors()}
        assert fresh.run(stand_in("first", world_size=2, pid_dir=str(tmp_path))).ok
        assert len(fresh.actors()) == 2  # no other gang was started
    assert {int((tmp_path / f"first-{rank}").read_text()) for rank in range(2)} == prestarted


def test_a_prestart_the_cluster_can_never_hold_starts_nothing(runner: RayRunner) -> None:
    with RayRunner(rank_fn=stand_in_rank) as fresh:
        fresh.prestart(world_size=64)
        assert fresh.actors() == [] and not fresh._pool.gangs
        [result] = fresh.run_many([stand_in("huge", world_size=64)])
    assert result.status is Status.error and "PlacementError" in (result.error or "")


def test_ranks_get_their_threads_and_no_gpu_before_torch_loads(
    runner: RayRunner, tmp_path: Path
) -> None:
    # Set by the actor itself rather than a runtime_env (which costs each actor a fresh
    # worker): OpenMP and CUDA read these once, as torch loads them.
    runner.release_idle()
    two_cores = replace(stand_in("threads", env_dir=str(tmp_path)), cpus_per_rank=2)
    with RayRunner(rank_fn=stand_in_rank) as fresh:
        assert fresh.run(two_cores).ok
    env = json.loads((tmp_path / "threads-0").read_text())
    assert env == {"OMP_NUM_THREADS": "2", "MKL_NUM_THREADS": "2", "CUDA_VISIBLE_DEVICES": ""}


def test_ranks_run_at_the_drivers_priority(runner: RayRunner, tmp_path: Path) -> None:
    # Ray's default worker niceness (15) made every other process on the node a drain on the
    # measured ranks: their throughput then measured the node's load, not the config.
    result = runner.run(stand_in("priority", pid_dir=str(tmp_path)))
    assert result.ok
    rank_pid = int((tmp_path / "priority-0").read_text())
    assert os.getpriority(os.PRIO_PROCESS, rank_pid) == os.getpriority(os.PRIO_PROCESS, 0)


def test_a_runner_that_keeps_warm_hands_its_actors_to_the_next_run_which_reads_code_afresh(
    runner: RayRunner, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    runner.release_idle()  # the runners below need a CPU this module's runner may hold
    monkeypatch.syspath_prepend(str(tmp_path))
    module = tmp_path / "edited_between_runs.py"
    for run, value in enumerate(["first", "second, edited"]):
        module.write_text(f"VALUE = {value!r}\n")  # another size: no stale bytecode either
        with RayRunner(rank_fn=stand_in_rank, preload_torch=False, keep_warm=True) as warm:
            experiment = stand_in(f"run{run}", pid_dir=str(tmp_path), value_of=module.stem)
            assert warm.run(experiment).ok
    # One actor ran both runs, and imported the module again for the second: its edit shows.
    pid = (tmp_path / "run0-0").read_text()
    assert (tmp_path / "run1-0").read_text() == pid
    assert (tmp_path / "run0-0.value").read_text() == "first"
    assert (tmp_path / "run1-0.value").read_text() == "second, edited"
    # A runner that does not keep warm takes the parked actor too, and leaves nothing running.
    with RayRunner(rank_fn=stand_in_rank, preload_torch=False, keep_warm=False) as cold:
        assert cold.run(stand_in("cold", pid_dir=str(tmp_path))).ok
    assert (tmp_path / "cold-0").read_text() == pid
    assert wait_for(lambda: not alive(int(pid))), "the actor outlived a runner without keep_warm"
