"""The service's state without HTTP: the queue across a restart, the job key, what a new job
starts from, and the refusal to listen beyond this machine without a token."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from autotune.cli import app
from autotune.service import knowledge
from autotune.service.queue import CANCELLED, QUEUED, RUNNING, SUCCEEDED, JobQueue
from autotune.service.requests import JobRequest, placement, tuning_job
from autotune.service.scheduler import Scheduler, _Child
from autotune.service.settings import (
    ServiceSettings,
    SettingsError,
    check_exposure,
    is_loopback,
)


def test_a_restart_requeues_running_jobs_in_submission_order(tmp_path: Path) -> None:
    queue = JobQueue(tmp_path / "jobs.db")
    first, second, third = (queue.add({"n": n}) for n in range(3))
    assert queue.start(first.id, "/r/1", pid=11) and queue.start(second.id, "/r/2", pid=12)
    queue.cancel(second.id)  # its process was being stopped when the service died
    again = JobQueue(tmp_path / "jobs.db")  # the service started again on the same state
    assert again.requeue_interrupted() == [first.id]
    assert [j.id for j in again.with_status(QUEUED)] == [first.id, third.id]
    requeued = again.get(first.id)
    assert requeued is not None and requeued.results_dir == "/r/1" and requeued.pid is None
    assert again.get(second.id).status == CANCELLED  # type: ignore[union-attr]
    assert again.start(first.id, "/r/1", pid=13)
    assert again.get(first.id).starts == 2  # type: ignore[union-attr]


def test_a_queue_an_earlier_service_wrote_gains_the_new_columns(tmp_path: Path) -> None:
    import sqlite3

    path = tmp_path / "jobs.db"
    with sqlite3.connect(path) as db:  # the first schema, one job queued in it
        db.execute(
            "CREATE TABLE jobs (seq INTEGER PRIMARY KEY AUTOINCREMENT, id TEXT NOT NULL UNIQUE, "
            "request TEXT NOT NULL, key TEXT, status TEXT NOT NULL, cached INTEGER NOT NULL "
            "DEFAULT 0, cached_from TEXT, error TEXT, best TEXT, results_dir TEXT, study TEXT, "
            "warm_start TEXT, command TEXT, experiments INTEGER, pid INTEGER, cancel_requested "
            "INTEGER NOT NULL DEFAULT 0, starts INTEGER NOT NULL DEFAULT 0, created_at TEXT NOT "
            "NULL, started_at TEXT, finished_at TEXT)"
        )
        db.execute(
            "INSERT INTO jobs (id, request, status, created_at) VALUES ('old', '{}', ?, 'now')",
            (QUEUED,),
        )
    queue = JobQueue(path)
    assert queue.start("old", "/r", pid=None)
    queue.progress("old", ["z1_mbs8"], started=True)
    job = queue.get("old")
    assert job is not None and job.running == ("z1_mbs8",) and job.experiment_started_at


def test_a_status_changes_only_from_the_one_expected(tmp_path: Path) -> None:
    queue = JobQueue(tmp_path / "jobs.db")
    job = queue.add({})
    assert queue.cancel(job.id) == CANCELLED
    assert not queue.start(job.id, "/r", pid=None)  # cancelled while queued: never starts
    other = queue.add({})
    assert queue.start(other.id, "/r", pid=None)
    assert queue.cancel(other.id) == RUNNING  # its process is stopped first
    assert queue.get(other.id).cancel_requested  # type: ignore[union-attr]
    assert queue.finish(other.id, CANCELLED)
    assert not queue.finish(other.id, SUCCEEDED)  # how it ended is written once
    assert queue.cancel("nope") is None


def key(tmp_path: Path, **fields: object) -> str:
    request = JobRequest.model_validate({"workload": "mlp", **fields})
    job = tuning_job(request, tmp_path / "any", "sqlite:///x.db")
    return knowledge.job_key(job, "cpu-test", placement(request))


def test_the_key_is_the_job_not_where_its_results_go(tmp_path: Path) -> None:
    base = key(tmp_path)
    assert key(tmp_path / "elsewhere") == base
    assert key(tmp_path, metric="throughput", world_size=2) == base  # the defaults, spelled out
    for change in (
        {"world_size": 1},
        {"workload_args": {"d_hidden": 64}},
        {"config": {"zero_optimization": {"stage": 1}}},
        {"metric": "latency"},
        {"cpus_per_rank": 2},
        {"device_memory": "1GiB"},
    ):
        assert key(tmp_path, **change) != base, change
    request = JobRequest(workload="mlp")
    job = tuning_job(request, tmp_path, "sqlite:///x.db")
    assert knowledge.job_key(job, "cpu-other", placement(request)) != base


def entry(job: str, size: int, world: int, stage: int, **more: object) -> dict[str, object]:
    return {
        "job": job,
        "key": job,
        "hardware": "gpu-a",
        "engine": "builtin",
        "num_params": size,
        "world_size": world,
        "best_overrides": {"zero_optimization.stage": stage},
        "cost_model": more.get("cost_model"),
        "finished_at": more.get("at", "2026-01-01"),
    }


def test_a_new_job_starts_from_the_latest_fit_and_the_nearest_answers() -> None:
    known = [  # newest first, as knowledge.entries lists them
        entry("big", 10**9, 8, 3, cost_model={"u": [1.0]}, at="2026-03"),
        entry("small", 10**6, 2, 1, at="2026-02"),
        entry("mid", 10**7, 2, 2, cost_model={"u": [0.5]}, at="2026-01"),
        {**entry("elsewhere", 10**6, 2, 0), "hardware": "gpu-b"},
        entry("same-answer", 10**6, 4, 1, at="2025-12"),
    ]
    warm, said = knowledge.warm_start(known, "gpu-a", "builtin", 2 * 10**6, 2)
    assert warm is not None and warm.cost_model == {"u": [1.0]}  # the latest fit
    assert said["answers_from"] == ["small", "mid", "big"]  # nearest first, distinct
    assert [a["zero_optimization.stage"] for a in warm.answers] == [1, 2, 3]
    assert knowledge.warm_start(known, "gpu-c", "builtin", 10**6, 2) == (None, {})


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost", "::1", "127.0.0.2"])
def test_loopback_needs_no_token(host: str) -> None:
    assert is_loopback(host)
    check_exposure(host, None)


@pytest.mark.parametrize("host", ["0.0.0.0", "10.1.2.3", "::", "head-node"])
def test_beyond_loopback_a_token_is_needed(host: str) -> None:
    with pytest.raises(SettingsError, match="set a token first"):
        check_exposure(host, None)
    check_exposure(host, "a-token")


def test_serve_refuses_an_open_host_without_a_token_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("AUTOTUNE_TOKEN", raising=False)
    result = CliRunner().invoke(
        app, ["serve", "--host", "0.0.0.0", "--state-dir", str(tmp_path / "s")]
    )
    assert result.exit_code == 2
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: --host 0.0.0.0")
    assert not (tmp_path / "s").exists()  # nothing was started or written
    empty = tmp_path / "token"
    empty.write_text("")
    result = CliRunner().invoke(app, ["serve", "--host", "0.0.0.0", "--token-file", str(empty)])
    assert result.exit_code == 2 and "is empty" in result.output
    short = tmp_path / "short"
    short.write_text("guessable\n")
    state = tmp_path / "s"
    result = CliRunner().invoke(
        app, ["serve", "--token-file", str(short), "--state-dir", str(state)]
    )
    assert result.exit_code == 2
    assert result.output.startswith("error: the token has 9 characters: use at least 16")
    assert len(result.output.strip().splitlines()) == 1 and not state.exists()


def scheduler(runner: str, gpus: float, held: list[float]) -> Scheduler:
    """A scheduler with jobs holding ``held`` GPUs each (no process started)."""
    from unittest import mock

    settings = ServiceSettings(runner=runner)
    running = Scheduler(settings, mock.Mock(), lambda: gpus)
    for number, count in enumerate(held):
        running._children[str(number)] = _Child(str(number), mock.Mock(), mock.Mock(), count)
    return running


def test_one_job_at_a_time_unless_the_gpus_leave_room() -> None:
    assert scheduler("ray", 0, [])._fits(2)  # the first always starts
    assert not scheduler("ray", 0, [0])._fits(0)  # CPU ranks: jobs would measure each other
    assert not scheduler("local", 8, [2])._fits(2)
    assert scheduler("ray", 8, [2, 4])._fits(2)
    assert not scheduler("ray", 8, [2, 4])._fits(4)  # waits, and so do the jobs behind it
