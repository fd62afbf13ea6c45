"""The tuning loop with a runner that has room for several experiments: every slot kept busy,
each result recorded as it finishes, and an interruption cancels what is in flight."""

from __future__ import annotations

from pathlib import Path

import pytest

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
