"""``autotune serve`` as a user runs it, in a process of its own (experiments as local
processes, the MLP on one rank: one to three experiments a job): a job ends with an answer, the same
job is answered from the record, the next model starts from what the first taught, the page
shows it in a real browser, and a ``kill -9`` of the service loses no job.

The tests share one service and its first job (a module fixture) and run in this file's
order: the last one kills the service.
"""

from __future__ import annotations

import json
import os
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from autotune.cli import app
from autotune.results import ResultsDir
from autotune.service.queue import JobQueue
from tests.service.served import SMALL_JOB, Served, chromium

pytest.importorskip("fastapi")
pytest.importorskip("optuna_dashboard")
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    served = Served(tmp_path_factory.mktemp("service") / "state", "--runner", "local").start()
    yield served
    served.stop()


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """Debian's headless Chromium, driven by Playwright (skipped where there is none, except
    in CI, which installs it)."""
    executable = chromium()
    if executable is None:
        if os.environ.get("CI"):
            pytest.fail("CI installs chromium-headless-shell: .ci/run")
        pytest.skip("no headless Chromium here (apt-get install chromium-headless-shell)")
    playwright = pytest.importorskip("playwright.sync_api")
    with playwright.sync_playwright() as driver:
        launched = driver.chromium.launch(executable_path=executable)
        yield launched
        launched.close()


@pytest.fixture(scope="module")
def first_job(service: Served) -> dict[str, Any]:
    answer = service.submit(SMALL_JOB)
    assert answer["status"] == "queued" and answer["cached"] is False
    return service.wait(answer["id"])


def test_a_job_ends_succeeded_with_the_best_ds_config(first_job: dict[str, Any]) -> None:
    assert first_job["status"] == "succeeded", first_job["error"]
    best = first_job["best"]
    assert best["name"].startswith("z") and best["value"] > 0
    assert best["ds_config"]["zero_optimization"]["stage"] in (0, 1, 2, 3)
    assert first_job["experiments"] >= 1 and not first_job["cached"]
    assert first_job["dashboard"].startswith("/dashboard/studies/")


def test_a_jobs_log_and_experiments_are_served(service: Served, first_job: dict[str, Any]) -> None:
    status, experiments = service.call("GET", f"/api/jobs/{first_job['id']}/experiments")
    assert status == 200 and len(experiments) == first_job["experiments"]
    assert first_job["best"]["name"] in {e["name"] for e in experiments}
    with urllib.request.urlopen(f"{service.url}/api/jobs/{first_job['id']}/log") as response:
        assert "optimal config:" in response.read().decode()


def test_the_same_job_again_is_answered_from_the_record(
    service: Served, first_job: dict[str, Any]
) -> None:
    again = service.submit(SMALL_JOB)
    assert again["cached"] is True and again["status"] == "succeeded"  # in the POST's answer
    view = service.job(again["id"])
    assert view["best"] == first_job["best"] and view["cached_from"] == first_job["id"]
    forced = service.submit({**SMALL_JOB, "force": True})
    assert forced["cached"] is False
    assert service.call("DELETE", f"/api/jobs/{forced['id']}")[0] == 200
    assert service.wait(forced["id"])["status"] == "cancelled"


def test_submit_from_a_shell(service: Served, first_job: dict[str, Any]) -> None:
    submitted = CliRunner().invoke(
        app,
        [
            *("submit", "--server", service.url, "--workload", "mlp"),
            *("--num-trials", "2", "--world-size", "1", "--wait"),
        ],
    )
    assert submitted.exit_code == 0, submitted.output
    first_line = json.loads(submitted.output.splitlines()[0])
    assert first_line["cached"] is True  # the first job's, answered from the record
    assert "answered with job " in submitted.stderr and "0 experiment(s)" not in submitted.stderr
    refused = CliRunner().invoke(
        app, ["submit", "--server", service.url, "--workload", "mlp", "--device-memory", "lots"]
    )
    assert refused.exit_code == 2
    assert refused.output.startswith("error: ") and len(refused.output.splitlines()) == 1


def test_another_model_starts_from_what_the_first_taught(
    service: Served, first_job: dict[str, Any]
) -> None:
    # One experiment: what it starts from is the point, not what it then finds.
    second = service.submit({**SMALL_JOB, "workload_args": {"d_hidden": 128}, "num_trials": 1})
    assert second["cached"] is False
    view = service.wait(second["id"])
    assert view["status"] == "succeeded", view["error"]
    warm = view["warm_start"]
    assert warm["cost_model_from"] == first_job["id"]
    assert warm["answers_from"] == [first_job["id"]]
    # The constants fitted on this hardware are a profile `autotune plan --hardware` reads.
    (profile,) = (service.state_dir / "hardware").glob("*.json")
    planned = CliRunner().invoke(
        app, ["plan", "--hardware", str(profile), "--workload", "mlp", "-n", "2", "-f", "json"]
    )
    assert planned.exit_code == 0, planned.output
    assert "z" in planned.output


def test_a_running_job_is_cancelled_as_ctrl_c_stops_a_run(
    service: Served, browser: Any, tmp_path: Path
) -> None:
    # More experiments than it can finish while the page is checked (about 1 s each).
    job = {**SMALL_JOB, "workload_args": {"d_hidden": 80}, "num_trials": 40, "tuner": "gridsearch"}
    answer = service.submit(job)
    service.wait(answer["id"], until=lambda view: view["experiments"] >= 1)
    # The page shows it running: for how long, the experiment in flight, its log's end.
    page = browser.new_page(viewport={"width": 1400, "height": 1200})
    page.goto(f"{service.url}/?job={answer['id']}")
    page.wait_for_selector("#progress")
    assert page.inner_text("#progress").startswith("Running for ")
    assert "finished z" in page.inner_text("#log")  # an experiment's line
    assert "d_hidden=80" in page.inner_text("#job-args")
    page.screenshot(path=str(tmp_path / "running.png"), full_page=True)
    page.close()
    status, view = service.call("DELETE", f"/api/jobs/{answer['id']}")
    # Stopping is under way, or already over where the job's process ended at once (between
    # experiments, Ctrl-C has nothing to wait for) before the answer was read back.
    assert status == 200
    assert (view["status"] == "running" and view["cancel_requested"]) or view["status"] == (
        "cancelled"
    )
    ended = service.wait(answer["id"])
    assert ended["status"] == "cancelled" and ended["best"] is None
    assert 1 <= ended["experiments"] < 40  # it stopped; what finished is kept in its study


def test_the_page_shows_the_jobs_the_answer_and_the_study(
    service: Served, first_job: dict[str, Any], browser: Any, tmp_path: Path
) -> None:
    import matplotlib.image

    shot = tmp_path / "page.png"
    page = browser.new_page(viewport={"width": 1400, "height": 1600})
    page.goto(f"{service.url}/?job={first_job['id']}")
    page.wait_for_selector("#best-config")
    assert page.inner_text("#job-status") == "succeeded"
    assert page.inner_text("#best-name") == first_job["best"]["name"]
    assert page.inner_text("#best-value").endswith(" samples/s")  # the value has its unit
    assert '"zero_optimization"' in page.inner_text("#best-config")
    assert "--deepspeed_config" in page.inner_text("#command")
    assert first_job["id"] in page.inner_text("#jobs")
    rows = page.locator("#experiments tbody tr")
    assert rows.count() == first_job["experiments"]
    # The study, in optuna-dashboard: its views and autotune's three figures.
    study = page.frame_locator("#study")
    for title in (
        "against micro-batch, by ZeRO stage",
        "with the device's limit",
        "prediction against the measured",
    ):
        study.get_by_text(title).first.wait_for(timeout=30_000)
    page.screenshot(path=str(shot), full_page=True)
    # Its list of studies, read-only: the buttons that could only fail are hidden, and why.
    page.goto(f"{service.url}/dashboard")
    page.get_by_text(first_job["study"]).first.wait_for(timeout=30_000)
    assert page.is_visible("#autotune-read-only")
    for label in ("rename study", "delete study"):
        assert page.locator(f"button[aria-label='{label}']").count() >= 1
        assert page.locator(f"button[aria-label='{label}']").first.is_hidden()
    assert page.get_by_role("button", name="Create").is_hidden()
    assert page.get_by_role("button", name="Reload").is_visible()  # reading stays
    page.close()
    pixels = matplotlib.image.imread(shot)
    assert pixels.shape[0] > 1000 and pixels.shape[1] == 1400
    header = pixels[10, 700, :3]  # the page's dark blue header bar
    assert header[2] > header[0] + 0.2


def test_the_page_asks_for_the_token(browser: Any, tmp_path: Path) -> None:
    import matplotlib.image

    served = Served(
        tmp_path / "state", "--runner", "local", env={"AUTOTUNE_TOKEN": "tok-123-of-the-page-test"}
    )
    served.start()
    try:
        assert served.call("GET", "/api/jobs")[0] == 401
        assert served.call("GET", "/api/jobs", token="tok-123-of-the-page-test")[0] == 200
        page = browser.new_page(viewport={"width": 1400, "height": 900})
        page.goto(served.url)
        page.wait_for_selector("#login:not([hidden])")
        # Logged out, the login box is all there is: no empty job panel under or over it.
        page.screenshot(path=str(tmp_path / "login.png"))
        login = page.locator("#login").bounding_box()
        assert login is not None
        assert page.is_hidden("#app"), "the job panel shows while logged out"
        assert _overlap(login, page.locator("#app").bounding_box()) == 0
        pixels = matplotlib.image.imread(tmp_path / "login.png")
        below = pixels[int(login["y"] + login["height"]) + 20 :, :, :3]
        assert below.min() > 0.9  # nothing drawn below the login box: the page's background
        page.fill("#token", "wrong")
        page.click("#login button")
        page.wait_for_selector("#login-error:has-text('not this service')")
        page.fill("#token", "tok-123-of-the-page-test")
        page.click("#login button")
        page.wait_for_selector("#no-jobs:not([hidden])")
        assert page.is_hidden("#login")
        page.close()
    finally:
        served.stop()


def _overlap(one: dict[str, float], other: dict[str, float] | None) -> float:
    """The area two bounding boxes share (a hidden element has none)."""
    if other is None:
        return 0.0
    width = min(one["x"] + one["width"], other["x"] + other["width"]) - max(one["x"], other["x"])
    height = min(one["y"] + one["height"], other["y"] + other["height"]) - max(one["y"], other["y"])
    return max(0.0, width) * max(0.0, height)


def test_kill_9_while_a_job_runs_then_restart_loses_nothing_and_runs_nothing_twice(
    service: Served,
) -> None:
    # Enough experiments that the kill lands in the middle (gridsearch: no early end): one has
    # finished, more are to come.
    job = {**SMALL_JOB, "workload_args": {"d_hidden": 96}, "num_trials": 3, "tuner": "gridsearch"}
    answer = service.submit(job)
    running = service.wait(answer["id"], until=lambda view: view["experiments"] >= 1)
    assert running["status"] == "running"
    stored = JobQueue(service.state_dir / "jobs.db").get(answer["id"])
    assert stored is not None and stored.pid is not None and stored.results_dir is not None
    before = [r["name"] for r in ResultsDir(stored.results_dir).records()]

    service.kill()
    deadline = time.monotonic() + 30
    while _alive(stored.pid):  # the job's process dies with the service
        assert time.monotonic() < deadline, "the job's process outlived the service"
        time.sleep(0.2)

    restarted = Served(service.state_dir, "--runner", "local").start()
    try:
        view = restarted.wait(answer["id"])
        assert view["status"] == "succeeded", view["error"]
        assert view["starts"] == 2  # resumed, not started afresh
        after = [r["name"] for r in ResultsDir(stored.results_dir).records()]
        assert after[: len(before)] == before  # nothing finished was lost
        assert len(after) == len(set(after))  # nothing ran twice
        assert view["experiments"] >= len(before)
    finally:
        restarted.stop()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie (killed, not yet reaped by its dead parent's successor) is gone too.
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False
