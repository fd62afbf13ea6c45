"""The tuning loop with a runner that has room for several experiments: every slot kept busy,
each result recorded as it finishes, and an interruption cancels what is in flight."""

from __future__ import annotations

import contextlib
import signal
import time
from dataclasses import replace
from pathlib import Path

import pytest

import autotune.tuning
from autotune.experiment import ExperimentResult
from autotune.profiling.interference import sample_cpu
from autotune.results import ResultsDir
from autotune.tuning import tune
from tests.fake_cluster import FakeCluster
from tests.runner.sim_cluster import tuning_job


def logged_names(results_dir: Path) -> list[str]:
    return [record["name"] for record in ResultsDir(results_dir).records()]


@pytest.mark.parametrize(
    ("fits", "uses_gpus", "max_concurrent", "expected"),
    [
        (3, True, None, 3),  # GPUs: as many as fit
        (3, False, None, 1),  # no GPUs: experiments sharing cores would measure each other
        (3, False, 2, 2),  # unless asked
        (2, True, 5, 2),  # never more than fit
    ],
)
def test_slots_in_flight(
    tmp_path: Path, fits: int, uses_gpus: bool, max_concurrent: int | None, expected: int
) -> None:
    runner = FakeCluster(fits, uses_gpus)
    report = tune(tuning_job(tmp_path), runner, max_concurrent=max_concurrent)
    assert runner.most_in_flight == expected
    names = logged_names(tmp_path)
    assert len(names) == len(set(names)) == report.num_run_now


def test_an_interruption_cancels_what_is_in_flight_and_a_resume_runs_it(tmp_path: Path) -> None:
    interrupted = FakeCluster(interrupt_after=5)
    with pytest.raises(KeyboardInterrupt):
        tune(tuning_job(tmp_path), interrupted)
    assert len(interrupted.cancelled) >= 2  # several were running, and were stopped
    kept = logged_names(tmp_path)
    assert len(kept) == 5 and not set(kept) & set(interrupted.cancelled)

    report = tune(tuning_job(tmp_path), FakeCluster())
    names = logged_names(tmp_path)
    assert names[:5] == kept and len(names) == len(set(names))
    assert set(interrupted.cancelled) <= set(names[5:])
    assert report.num_resumed == 5
    one_at_a_time = tmp_path / "one-at-a-time"
    tune(tuning_job(one_at_a_time), FakeCluster(fits=1))
    assert sorted(names) == sorted(logged_names(one_at_a_time))


class DropsCtrlC(FakeCluster):
    """Ctrl-C lands while the third result is awaited, where Python drops what it raises
    (a garbage-collection callback, a ``__del__``)."""

    def wait(self) -> list[ExperimentResult]:
        if self.finished == 2:
            with contextlib.suppress(KeyboardInterrupt):
                signal.raise_signal(signal.SIGINT)
        return super().wait()


def test_a_ctrl_c_whose_interrupt_was_dropped_still_stops_the_run(tmp_path: Path) -> None:
    runner = DropsCtrlC()
    with pytest.raises(KeyboardInterrupt):
        tune(tuning_job(tmp_path), runner)
    assert len(logged_names(tmp_path)) == 3 and runner.cancelled  # stopped as it came round


@pytest.mark.parametrize("neighbour_leaves", [True, False])
def test_a_busy_machine_is_waited_for_and_what_it_slowed_is_measured_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, neighbour_leaves: bool
) -> None:
    # Every search experiment meets a neighbour: the tuner asks the loop to wait for the
    # machine to quiet down (nothing in flight meanwhile), and measures again once it has.
    cluster = FakeCluster(fits=1, uses_gpus=False, disturbed=True)
    waits: list[tuple[float, int, int]] = []

    def wait_for_quiet(timeout_s: float, demand_cores: int) -> bool:
        waits.append((timeout_s, demand_cores, len(cluster.in_flight)))
        cluster.disturbed = not neighbour_leaves
        return neighbour_leaves

    monkeypatch.setattr(autotune.tuning, "wait_for_quiet", wait_for_quiet)
    # The run began 100 s ago: a fifth of that is what it may wait.
    job = replace(tuning_job(tmp_path), started_s=time.monotonic() - 100)
    report = tune(job, cluster)
    assert len(waits) == 1
    timeout_s, demand_cores, in_flight = waits[0]
    assert 20 <= timeout_s <= 25 and demand_cores == 2 and in_flight == 0
    summary = report.summary
    assert summary.waited_for_quiet_s > 0
    if neighbour_leaves:
        assert summary.num_remeasured >= 1 and summary.best is not None
        assert not summary.best.disturbed
    else:
        assert summary.num_remeasured == 0 and summary.best is not None and summary.best.disturbed


@pytest.mark.parametrize(("others_share", "busy"), [(0.0, False), (1.0, True)])
def test_a_neighbour_busy_before_the_first_experiment_is_told_apart(
    tmp_path: Path, others_share: float, busy: bool
) -> None:
    # The job's start, 2 s ago, with others keeping ``others_share`` of the node's cores busy
    # since: a neighbour already there before the first experiment is the machine's state.
    now = sample_cpu()
    if now is None:
        pytest.skip("no /proc/stat")
    others_s = 2.0 * others_share * now.node_cores
    start = replace(now, node_busy_s=now.node_busy_s - others_s, at_s=now.at_s - 2.0)
    job = replace(tuning_job(tmp_path), started_cpu=start)
    assert autotune.tuning._busy_before_start(job) is busy
    assert autotune.tuning._busy_before_start(replace(job, started_cpu=None)) is None
