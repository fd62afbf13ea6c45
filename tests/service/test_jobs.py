"""Jobs run by the scheduler, each in a process of its own, without HTTP: a job stuck before
its first experiment fails saying where it hung and the queue moves on; no job or rank is
handed the service's secrets; what jobs write is the service owner's alone."""

from __future__ import annotations

import dataclasses
import json
import os
import stat
import time
from pathlib import Path
from typing import Any

import pytest

from autotune.service.queue import FINISHED, JobQueue
from autotune.service.scheduler import Scheduler, job_environment
from autotune.service.server import open_queue, open_storage, withdraw_secrets
from autotune.service.settings import ServiceSettings, lend_password, url_without_password

TOKEN = "the-service-token-" + "x" * 8
STARTUP_LIMIT_S = 2.0

# Says when its import began (a loaded machine takes a while to get there: Python, torch).
SLEEPS_AT_IMPORT = """\
import pathlib, time

pathlib.Path(__file__).with_suffix(".importing").touch()
time.sleep(600)


def build():
    ...
"""

# Each process that imports it (the job's, each rank's) writes down its environment.
TELLS_ITS_ENVIRONMENT = """\
import json
import os

with open(os.path.join(os.path.dirname(__file__), f"env-{os.getpid()}.json"), "w") as out:
    json.dump(dict(os.environ), out)


def build():
    from autotune.workloads import build_mlp

    return build_mlp(d_hidden=32, n_layer=1)
"""


def wait_until_ended(queue: JobQueue, job_id: str, timeout_s: float = 240.0) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        job = queue.get(job_id)
        assert job is not None
        if job.status in FINISHED:
            return job
        assert time.monotonic() < deadline, f"job {job_id} stuck: {job}"
        time.sleep(0.5)


@pytest.mark.slow
def test_a_job_stuck_before_its_first_experiment_fails_and_the_next_gets_no_secret(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "shared"
    root.mkdir()
    (root / "sleepy.py").write_text(SLEEPS_AT_IMPORT)
    (root / "envseen.py").write_text(TELLS_ITS_ENVIRONMENT)
    monkeypatch.setenv("AUTOTUNE_TOKEN", TOKEN)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    settings = ServiceSettings(
        state_dir=tmp_path / "state",
        token=TOKEN,
        allowed_roots=(root.resolve(),),
        runner="local",
    )
    queue = open_queue(settings)
    stuck = queue.add({"workload": "sleepy:build"})
    after = queue.add({"workload": "envseen:build", "num_trials": 1, "tuner": "gridsearch"})
    scheduler = Scheduler(settings, queue)
    scheduler.start()
    try:
        # Once the job hangs where the test means it to, a small limit: the test is quick
        # on a loaded machine too, and the next job has the default limit's time.
        deadline = time.monotonic() + 240
        while not (root / "sleepy.importing").exists():
            assert time.monotonic() < deadline, queue.get(stuck.id)
            time.sleep(0.2)
        scheduler.settings = dataclasses.replace(settings, startup_limit_s=STARTUP_LIMIT_S)
        failed = wait_until_ended(queue, stuck.id)
        scheduler.settings = settings
        ended = wait_until_ended(queue, after.id)
    finally:
        scheduler.stop()

    assert failed.status == "failed" and failed.experiments in (None, 0)
    error = str(failed.error)
    assert "\n" not in error
    assert error.startswith(f"no experiment started within {STARTUP_LIMIT_S:g} s")
    assert "importing the workload's module" in error
    assert f"{root.resolve() / 'sleepy.py'}, line 4" in error  # time.sleep(600)
    assert ended.status == "succeeded", ended.error  # the queue moved on

    seen = [json.loads(path.read_text()) for path in root.glob("env-*.json")]
    assert len(seen) >= 2  # the job's process and its ranks
    for environment in seen:
        assert "AUTOTUNE_TOKEN" not in environment
        assert not any(TOKEN in value for value in environment.values())
    results = Path(str(ended.results_dir))
    written = [path for path in results.rglob("*") if path.is_file()]
    assert any(path.name == "metrics.json" for path in written)  # an experiment's files
    for path in [results, *written]:
        mode = stat.S_IMODE(path.stat().st_mode)
        assert mode & 0o077 == 0, f"{path} is {oct(mode)}"
        assert TOKEN not in path.read_text(errors="replace") if path.is_file() else True


def test_the_state_directory_and_its_databases_are_private(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir(mode=0o755)  # an existing folder is made private too
    settings = ServiceSettings(state_dir=state)
    open_queue(settings)
    open_storage(settings)
    assert stat.S_IMODE(state.stat().st_mode) == 0o700
    for name in ("jobs.db", "studies.db"):
        assert stat.S_IMODE((state / name).stat().st_mode) == 0o600


def test_no_secret_is_in_a_jobs_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = "postgresql://me:the-db-password@db:5432/autotune"
    monkeypatch.setenv("AUTOTUNE_TOKEN", TOKEN)
    monkeypatch.setenv("TEAM_DB", url)
    monkeypatch.setenv("KEPT", "an ordinary value")
    settings = ServiceSettings(state_dir=tmp_path, token=TOKEN, storage=url)
    environment = job_environment(settings)
    assert environment["KEPT"] == "an ordinary value"
    assert "AUTOTUNE_TOKEN" not in environment and "TEAM_DB" not in environment
    assert not any(secret in value for value in environment.values() for secret in (TOKEN, url))
    # The service's own environment too: a local Ray's processes inherit it.
    monkeypatch.setattr("autotune.service.server.lend_password", lambda url: url)
    withdraw_secrets(settings)
    assert "AUTOTUNE_TOKEN" not in os.environ and "TEAM_DB" not in os.environ
    assert os.environ["KEPT"] == "an ordinary value"


def test_a_storage_password_is_given_at_connect_time_not_in_the_url() -> None:
    from sqlalchemy.dialects.postgresql.psycopg2 import PGDialect_psycopg2
    from sqlalchemy.engine import Engine, make_url
    from sqlalchemy.event import contains, remove

    from autotune.service import settings as service_settings

    url = "postgresql://me:the-db-password@db:5432/autotune"
    bare = lend_password(url)
    assert bare == url_without_password(url) == "postgresql://me@db:5432/autotune"
    give = service_settings._LENT[url]
    try:
        assert contains(Engine, "do_connect", give)
        dialect = PGDialect_psycopg2()
        cargs, cparams = dialect.create_connect_args(make_url(bare))
        assert "password" not in cparams
        give(dialect, None, cargs, cparams)
        assert cparams["password"] == "the-db-password"  # given as it connects
        other_args, other = dialect.create_connect_args(make_url("postgresql://me@db/other"))
        give(dialect, None, other_args, other)
        assert "password" not in other  # another database is not given it
    finally:
        remove(Engine, "do_connect", give)
        del service_settings._LENT[url]


def test_where_a_stuck_job_hung_names_its_own_code_under_a_librarys() -> None:
    import sysconfig

    from autotune.service.worker import where_it_hung

    stdlib = sysconfig.get_paths()["stdlib"]
    dump = f"""Thread 0x2 (most recent call first):
  File "{stdlib}/threading.py", line 320 in wait

Current thread 0x1 (most recent call first):
  File "/env/lib/python3.11/site-packages/ray/_private/worker.py", line 900 in get
  File "/srv/autotune/runner/ray_runner.py", line 120 in prestart
  File "/srv/autotune/service/worker.py", line 70 in main
  File "<frozen runpy>", line 198 in _run_module_as_main
"""
    assert where_it_hung(dump) == (
        "on Ray (starting it, or waiting for its ranks to be placed) (at "
        "/env/lib/python3.11/site-packages/ray/_private/worker.py, line 900, in get, called "
        "from /srv/autotune/runner/ray_runner.py, line 120, in prestart)"
    )
    assert where_it_hung("") == "where, its process did not say (it wrote no stack)"
