"""The job queue: every job the service was asked for, its request, status and outcome, in
SQLite under the state directory.

A job is written (and the write synced) before its POST is answered, so a ``kill -9`` of the
service loses none: started again on the same state directory, it puts the jobs it was running
back at the head of the queue (:meth:`JobQueue.requeue_interrupted`), and each resumes from its
study, where a finished experiment is never run again.

Who writes what: the service adds jobs, starts them (``queued`` → ``running``) and cancels
them; a job's own process (:mod:`autotune.service.worker`) writes how it ended. Every change
of status is a compare-and-set on the status it expects, so the two never undo each other.
SQLite's WAL mode lets the page read while a job writes.
"""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
import uuid
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

QUEUED, RUNNING, SUCCEEDED, FAILED, CANCELLED = (
    "queued",
    "running",
    "succeeded",
    "failed",
    "cancelled",
)
FINISHED = (SUCCEEDED, FAILED, CANCELLED)

_SCHEMA = """
CREATE TABLE IF NOT EXISTS jobs (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,  -- submission order
    id TEXT NOT NULL UNIQUE,
    request TEXT NOT NULL,                  -- the validated request, JSON
    key TEXT,                               -- what makes two jobs the same (knowledge.job_key)
    status TEXT NOT NULL,
    cached INTEGER NOT NULL DEFAULT 0,
    cached_from TEXT,                       -- the job whose answer this one is
    error TEXT,
    best TEXT,                              -- JSON: {name, value, ds_config}
    results_dir TEXT,
    study TEXT,                             -- JSON: {name, storage}
    warm_start TEXT,                        -- JSON: what it started from
    command TEXT,                           -- how to train with the answer
    experiments INTEGER,                    -- how many it ran, once it ended
    pid INTEGER,
    cancel_requested INTEGER NOT NULL DEFAULT 0,
    starts INTEGER NOT NULL DEFAULT 0,      -- how often it was started (resumed: > 1)
    created_at TEXT NOT NULL,
    started_at TEXT,
    finished_at TEXT
)
"""
# Columns added since the first schema: a queue written by an earlier service gains them.
_ADDED_COLUMNS = {
    "running": "TEXT",  # JSON: the names of the experiments in flight
    "experiment_started_at": "TEXT",  # the latest experiment's start, in this start of the job
}


def utc_now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


@dataclass(frozen=True)
class Job:
    """One row of the queue."""

    id: str
    seq: int
    request: Mapping[str, Any]
    status: str
    key: str | None = None
    cached: bool = False
    cached_from: str | None = None
    error: str | None = None
    best: Mapping[str, Any] | None = None
    results_dir: str | None = None
    study: Mapping[str, Any] | None = None
    warm_start: Mapping[str, Any] | None = None
    command: str | None = None
    experiments: int | None = None
    pid: int | None = None
    cancel_requested: bool = False
    starts: int = 0
    created_at: str = ""
    started_at: str | None = None
    finished_at: str | None = None
    running: tuple[str, ...] = ()
    experiment_started_at: str | None = None

    @classmethod
    def from_row(cls, row: sqlite3.Row) -> Job:
        def loaded(name: str) -> Any:
            return json.loads(row[name]) if row[name] is not None else None

        return cls(
            id=row["id"],
            seq=row["seq"],
            request=loaded("request"),
            status=row["status"],
            key=row["key"],
            cached=bool(row["cached"]),
            cached_from=row["cached_from"],
            error=row["error"],
            best=loaded("best"),
            results_dir=row["results_dir"],
            study=loaded("study"),
            warm_start=loaded("warm_start"),
            command=row["command"],
            experiments=row["experiments"],
            pid=row["pid"],
            cancel_requested=bool(row["cancel_requested"]),
            starts=row["starts"],
            created_at=row["created_at"],
            started_at=row["started_at"],
            finished_at=row["finished_at"],
            running=tuple(loaded("running") or ()),
            experiment_started_at=row["experiment_started_at"],
        )


class JobQueue:
    """The queue in the SQLite file at ``path`` (created if need be). Each call opens its own
    connection: the service's threads and the jobs' processes share the file, not a handle.

    Example:
        >>> import tempfile, pathlib
        >>> with tempfile.TemporaryDirectory() as folder:
        ...     queue = JobQueue(pathlib.Path(folder) / "jobs.db")
        ...     job = queue.add({"workload": "mlp"})
        ...     started = queue.start(job.id, "/tmp/results", pid=None)
        ...     queue.finish(job.id, "succeeded"), queue.get(job.id).status
        (True, 'succeeded')
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        create_private(self.path)
        db = sqlite3.connect(self.path, timeout=30, isolation_level=None)
        try:  # outside a transaction: the journal mode cannot change inside one
            db.execute("PRAGMA journal_mode=WAL")
            db.execute(_SCHEMA)
            present = {row[1] for row in db.execute("PRAGMA table_info(jobs)")}
            for name, kind in _ADDED_COLUMNS.items():
                if name not in present:
                    db.execute(f"ALTER TABLE jobs ADD COLUMN {name} {kind}")
        finally:
            db.close()

    @contextmanager
    def _connection(self) -> Iterator[sqlite3.Connection]:
        # FULL: a commit is on disk before the call returns (and so before a POST is
        # answered); the timeout waits out another process's write instead of failing.
        db = sqlite3.connect(self.path, timeout=30, isolation_level=None)
        db.row_factory = sqlite3.Row
        try:
            db.execute("PRAGMA synchronous=FULL")
            db.execute("BEGIN IMMEDIATE")
            try:
                yield db
            except BaseException:
                db.execute("ROLLBACK")
                raise
            db.execute("COMMIT")
        finally:
            db.close()

    # --- adding -------------------------------------------------------------------------------

    def add(
        self,
        request: Mapping[str, Any],
        key: str | None = None,
        answer: Job | None = None,
    ) -> Job:
        """A new job, queued; or with ``answer`` (a finished job with the same key) already
        answered from it."""
        job_id = uuid.uuid4().hex[:12]
        now = utc_now()
        with self._connection() as db:
            if answer is None:
                db.execute(
                    "INSERT INTO jobs (id, request, key, status, created_at) VALUES (?,?,?,?,?)",
                    (job_id, json.dumps(dict(request)), key, QUEUED, now),
                )
            else:
                db.execute(
                    "INSERT INTO jobs (id, request, key, status, cached, cached_from, best, "
                    "results_dir, study, command, experiments, created_at, started_at, "
                    "finished_at) VALUES (?,?,?,?,1,?,?,?,?,?,0,?,?,?)",
                    (
                        job_id,
                        json.dumps(dict(request)),
                        key,
                        SUCCEEDED,
                        answer.cached_from or answer.id,
                        _dumps(answer.best),
                        answer.results_dir,
                        _dumps(answer.study),
                        answer.command,
                        now,
                        now,
                        now,
                    ),
                )
        job = self.get(job_id)
        assert job is not None
        return job

    # --- reading ------------------------------------------------------------------------------

    def get(self, job_id: str) -> Job | None:
        with self._connection() as db:
            row = db.execute("SELECT * FROM jobs WHERE id = ?", (job_id,)).fetchone()
        return Job.from_row(row) if row is not None else None

    def latest(self, limit: int = 200, before: Job | None = None) -> list[Job]:
        """The latest ``limit`` jobs (submitted before ``before``, if given), newest first."""
        below = before.seq if before is not None else None
        with self._connection() as db:
            rows = db.execute(
                "SELECT * FROM jobs WHERE ? IS NULL OR seq < ? ORDER BY seq DESC LIMIT ?",
                (below, below, limit),
            )
            return [Job.from_row(row) for row in rows.fetchall()]

    def with_status(self, *statuses: str) -> list[Job]:
        """Jobs in any of ``statuses``, in submission order."""
        marks = ",".join("?" * len(statuses))
        with self._connection() as db:
            rows = db.execute(
                f"SELECT * FROM jobs WHERE status IN ({marks}) ORDER BY seq", statuses
            )
            return [Job.from_row(row) for row in rows.fetchall()]

    def answered(self, key: str) -> Job | None:
        """The latest job with ``key`` that succeeded by running (not from another's answer)."""
        with self._connection() as db:
            row = db.execute(
                "SELECT * FROM jobs WHERE key = ? AND status = ? AND cached = 0 "
                "ORDER BY seq DESC LIMIT 1",
                (key, SUCCEEDED),
            ).fetchone()
        return Job.from_row(row) if row is not None else None

    # --- changing -----------------------------------------------------------------------------

    def _set(self, job_id: str, expected: tuple[str, ...], **values: Any) -> bool:
        """Set ``values`` on the job if its status is one of ``expected``; whether it was."""
        columns = ", ".join(f"{name} = ?" for name in values)
        marks = ",".join("?" * len(expected))
        with self._connection() as db:
            changed = db.execute(
                f"UPDATE jobs SET {columns} WHERE id = ? AND status IN ({marks})",
                (*values.values(), job_id, *expected),
            ).rowcount
        return changed == 1

    def start(self, job_id: str, results_dir: str, pid: int | None) -> bool:
        """``queued`` → ``running``; False if it was not queued (cancelled meanwhile)."""
        with self._connection() as db:
            changed = db.execute(
                "UPDATE jobs SET status = ?, results_dir = ?, pid = ?, starts = starts + 1, "
                "started_at = COALESCE(started_at, ?), running = NULL, "
                "experiment_started_at = NULL WHERE id = ? AND status = ?",
                (RUNNING, results_dir, pid, utc_now(), job_id, QUEUED),
            ).rowcount
        return changed == 1

    def progress(self, job_id: str, running: Sequence[str], started: bool) -> None:
        """What a running job has in flight; ``started``: an experiment has just started."""
        values: dict[str, Any] = {"running": json.dumps(list(running))}
        if started:
            values["experiment_started_at"] = utc_now()
        self._set(job_id, (RUNNING,), **values)

    def set_pid(self, job_id: str, pid: int) -> None:
        self._set(job_id, (RUNNING,), pid=pid)

    def note(self, job_id: str, **values: Any) -> None:
        """Record what a running job found out (its key, study, warm start), JSON where
        structured."""
        self._set(
            job_id,
            (QUEUED, RUNNING),
            **{k: _dumps(v) if isinstance(v, Mapping) else v for k, v in values.items()},
        )

    def finish(
        self,
        job_id: str,
        status: str,
        *,
        error: str | None = None,
        best: Mapping[str, Any] | None = None,
        command: str | None = None,
        cached_from: str | None = None,
        experiments: int | None = None,
        expected: tuple[str, ...] = (RUNNING,),
    ) -> bool:
        """``running`` (or ``expected``) → ``status``, with how it ended."""
        assert status in FINISHED
        values: dict[str, Any] = {
            "status": status,
            "error": error,
            "best": _dumps(best),
            "finished_at": utc_now(),
            "pid": None,
        }
        if command is not None:
            values["command"] = command
        if experiments is not None:
            values["experiments"] = experiments
        if cached_from is not None:
            values.update(cached=1, cached_from=cached_from)
        return self._set(job_id, expected, **values)

    def cancel(self, job_id: str) -> str | None:
        """Cancel: a queued job at once, a running one marked for its process to be stopped
        (the scheduler does that). The job's status after the call, None if there is no
        such job."""
        with self._connection() as db:
            db.execute(
                "UPDATE jobs SET status = ?, finished_at = ? WHERE id = ? AND status = ?",
                (CANCELLED, utc_now(), job_id, QUEUED),
            )
            db.execute(
                "UPDATE jobs SET cancel_requested = 1 WHERE id = ? AND status = ?",
                (job_id, RUNNING),
            )
            row = db.execute("SELECT status FROM jobs WHERE id = ?", (job_id,)).fetchone()
        return row["status"] if row is not None else None

    def delete(self, job_id: str) -> Job | None:
        """Forget a finished job: its row, as it was (None: no such finished job)."""
        marks = ",".join("?" * len(FINISHED))
        with self._connection() as db:
            row = db.execute(
                f"SELECT * FROM jobs WHERE id = ? AND status IN ({marks})", (job_id, *FINISHED)
            ).fetchone()
            if row is not None:
                db.execute("DELETE FROM jobs WHERE id = ?", (job_id,))
        return Job.from_row(row) if row is not None else None

    def requeue_interrupted(self) -> list[str]:
        """After a restart: the jobs a dead service left running go back to the queue (they
        resume from their studies), those it was cancelling end cancelled. Their ids."""
        with self._connection() as db:
            db.execute(
                "UPDATE jobs SET status = ?, finished_at = ?, pid = NULL "
                "WHERE status = ? AND cancel_requested = 1",
                (CANCELLED, utc_now(), RUNNING),
            )
            rows = db.execute("SELECT id FROM jobs WHERE status = ?", (RUNNING,)).fetchall()
            db.execute("UPDATE jobs SET status = ?, pid = NULL WHERE status = ?", (QUEUED, RUNNING))
        return [row["id"] for row in rows]


def create_private(path: Path) -> None:
    """Create the file at ``path`` readable by its owner only (0600), if it is not there:
    SQLite creates its database, and its ``-wal`` and ``-shm`` files, with this mode."""
    with contextlib.suppress(FileExistsError):
        os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))


def _dumps(value: Mapping[str, Any] | None) -> str | None:
    return json.dumps(dict(value)) if value is not None else None
