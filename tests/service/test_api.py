"""The service's API in process (FastAPI's TestClient, no job run): what it answers, what it
refuses (each bad request a 4xx with one message, and nothing queued), the token."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("optuna_dashboard")

from fastapi.testclient import TestClient

from autotune.service.app import TOKEN_COOKIE, create_app
from autotune.service.queue import JobQueue
from autotune.service.requests import MAX_BODY_BYTES
from autotune.service.server import open_queue, open_storage
from autotune.service.settings import ServiceSettings

TOKEN = "s3cret-token-of-the-test"
LOOPBACK = "http://127.0.0.1:8080"


def service(tmp_path: Path, **settings: Any) -> tuple[TestClient, JobQueue]:
    config = ServiceSettings(state_dir=tmp_path / "state", runner="local", **settings)
    queue = open_queue(config)
    app = create_app(config, queue, open_storage(config))
    return TestClient(app, base_url=LOOPBACK), queue


@pytest.fixture
def client(tmp_path: Path) -> Iterator[tuple[TestClient, JobQueue]]:
    yield service(tmp_path)


def test_health_and_an_empty_queue(client: tuple[TestClient, JobQueue]) -> None:
    http, _ = client
    assert http.get("/api/health").status_code == 200
    assert http.get("/api/jobs").json() == []
    assert http.get("/api/jobs/nope").status_code == 404


def test_a_job_is_queued_listed_and_cancelled(client: tuple[TestClient, JobQueue]) -> None:
    http, queue = client
    answer = http.post("/api/jobs", json={"workload": "mlp", "num_trials": 3})
    assert answer.status_code == 201, answer.text
    job = answer.json()
    assert job["status"] == "queued" and job["cached"] is False
    stored = queue.get(job["id"])
    assert stored is not None and stored.request == {"workload": "mlp", "num_trials": 3}
    assert stored.key is not None  # keyed before the answer: the same job is found next time
    assert [j["id"] for j in http.get("/api/jobs").json()] == [job["id"]]
    view = http.get(f"/api/jobs/{job['id']}").json()
    assert {"id", "status", "experiments", "best", "cached", "error"} <= set(view)
    assert view["best"] is None and view["experiments"] == 0
    log = http.get(f"/api/jobs/{job['id']}/log")
    assert log.status_code == 200 and log.text == ""  # not started: nothing said yet
    assert http.delete(f"/api/jobs/{job['id']}").json()["status"] == "cancelled"


def test_the_same_job_is_answered_from_a_finished_one(
    client: tuple[TestClient, JobQueue],
) -> None:
    http, queue = client
    first = http.post("/api/jobs", json={"workload": "mlp", "world_size": 2}).json()
    assert queue.start(first["id"], "/nowhere", pid=None)
    best = {"name": "z1_mbs8", "value": 10.0, "ds_config": {"zero_optimization": {"stage": 1}}}
    assert queue.finish(first["id"], "succeeded", best=best, experiments=5)
    # The defaults spelled out are the same job; another world size is not.
    again = http.post(
        "/api/jobs", json={"workload": "mlp", "world_size": 2, "metric": "throughput"}
    )
    assert again.json()["cached"] is True and again.json()["status"] == "succeeded"
    view = http.get(f"/api/jobs/{again.json()['id']}").json()
    assert (
        view["best"] == {**best, "metric": "throughput", "unit": "samples/s"}
        and view["cached_from"] == first["id"]
    )
    assert view["experiments"] == 0  # it ran none
    other = http.post("/api/jobs", json={"workload": "mlp", "world_size": 1}).json()
    assert other["cached"] is False
    forced = http.post("/api/jobs", json={"workload": "mlp", "world_size": 2, "force": True})
    assert forced.json()["cached"] is False


@pytest.mark.parametrize(
    ("body", "status", "says"),
    [
        ({"workload": "mlp", "colour": "red"}, 422, "colour: unknown field"),
        ({"world_size": "two"}, 422, "world_size"),
        ({"world_size": 0}, 422, "world_size"),
        ({"workload_args": {"d": [[1, 2]]}}, 422, "workload_args"),  # one level of JSON
        ({"config": {"zero_optimization": {"stage": 7}}}, 400, "zero_optimization.stage"),
        ({"workload": "os:system"}, 403, "built-in workloads only"),
        ({"workload": "gpt; rm -rf /"}, 400, "expected a built-in name"),
        ({"script": ["train.py"], "cwd": "/tmp"}, 403, "runs no scripts"),
        ({"script": ["train.py"]}, 400, "needs cwd"),
        ({"cwd": "/tmp"}, 400, "give script too"),
        ({"script": ["train\x00.py"], "cwd": "/tmp"}, 422, "NUL"),
        # What used to fail only once the job ran, refused at the door:
        ({"seed": 2**80}, 422, "seed: Input should be less than or equal to 2147483647"),
        ({"seed": -1}, 422, "seed"),
        ({"world_size": 65536}, 400, "needs 65536 CPUs: the cluster has"),
        ({"world_size": 2, "cpus_per_rank": 1024}, 400, "needs 2048 CPUs"),
        ({"workload": "hf:a/../../x"}, 400, "expected a built-in name"),
        ({"workload": "gtp"}, 400, "did you mean 'gpt'"),
        ({"workload": "mlp", "workload_args": {"d_hidden": "wide"}}, 400, "expected int"),
        ({"workload": "mlp", "workload_args": {"d_hiden": 64}}, 400, "did you mean 'd_hidden'"),
        ({"workload_args": {"x-y": 1}}, 422, "workload_args.x-y"),
        ({"workload_args": {"n": "x" * 5000}}, 422, "workload_args.n"),
        ({"start_profile_step": 9, "end_profile_step": 3}, 400, "end_profile_step"),
    ],
)
def test_a_bad_request_is_refused_with_one_message_and_nothing_queued(
    client: tuple[TestClient, JobQueue], body: dict[str, Any], status: int, says: str
) -> None:
    http, queue = client
    answer = http.post("/api/jobs", json=body)
    assert answer.status_code == status, answer.text
    detail = answer.json()["detail"]
    assert isinstance(detail, str) and "\n" not in detail and says in detail
    assert queue.latest() == []


@pytest.mark.parametrize("number", [b"Infinity", b"-Infinity", b"NaN"])
def test_a_number_json_does_not_have_is_refused_not_stored_as_null(
    client: tuple[TestClient, JobQueue], number: bytes
) -> None:
    http, queue = client
    for field in (b"timeout", b"time_budget", b"gpus_per_rank"):
        body = b'{"' + field + b'": ' + number + b"}"
        answer = http.post("/api/jobs", content=body, headers={"content-type": "application/json"})
        assert answer.status_code == 422, answer.text
        assert answer.json()["detail"] == f"{field.decode()}: Input should be a finite number"
    assert queue.latest() == []


def test_a_script_jobs_config_and_flags_are_checked_at_the_door(tmp_path: Path) -> None:
    root = tmp_path / "shared"
    root.mkdir()
    (root / "train.py").write_text("print('hi')\n")
    http, queue = service(tmp_path, allowed_roots=(root.resolve(),))
    bad = {"script": ["train.py"], "cwd": str(root), "config": {"train_batch_size": -4}}
    answer = http.post("/api/jobs", json=bad)
    assert answer.status_code == 400 and "train_batch_size" in answer.json()["detail"]
    assert queue.latest() == []


def test_hf_names_are_transformers_model_types(client: tuple[TestClient, JobQueue]) -> None:
    pytest.importorskip("transformers")
    http, queue = client
    for name, says in [
        ("hf:gtp2", "no model type 'gtp2' (did you mean 'gpt2'?)"),
        ("hf:../gpt2", "expected a built-in name"),
        ("hf:gpt2/x", "expected a built-in name"),
    ]:
        answer = http.post("/api/jobs", json={"workload": name})
        assert answer.status_code == 400 and says in answer.json()["detail"], answer.text
    hub = {"workload": "hf:gpt2", "workload_args": {"attn_implementation": "org/kernels"}}
    answer = http.post("/api/jobs", json=hub)
    assert answer.status_code == 400 and "Hub repository" in answer.json()["detail"]
    assert queue.latest() == []


def test_what_is_not_json_or_too_large_is_refused(client: tuple[TestClient, JobQueue]) -> None:
    http, queue = client
    form = http.post(
        "/api/jobs", content=b'{"workload": "mlp"}', headers={"content-type": "text/plain"}
    )
    assert form.status_code == 415
    broken = http.post("/api/jobs", content=b"{", headers={"content-type": "application/json"})
    assert broken.status_code == 422 and broken.json()["detail"] == "the body is not JSON"
    huge = {"config": {"pad": "x" * (MAX_BODY_BYTES + 1)}}
    assert http.post("/api/jobs", json=huge).status_code == 413

    def chunks() -> Iterator[bytes]:  # no Content-Length: bounded as it arrives
        yield b'{"config": {"pad": "'
        for _ in range(MAX_BODY_BYTES // 65536 + 1):
            yield b"x" * 65536
        yield b'"}}'

    streamed = http.post(
        "/api/jobs", content=chunks(), headers={"content-type": "application/json"}
    )
    assert streamed.status_code == 413
    assert queue.latest() == []


def test_paths_must_lie_inside_the_allowed_roots(tmp_path: Path) -> None:
    root = tmp_path / "shared"
    (root / "project").mkdir(parents=True)
    (root / "project" / "train.py").write_text("print('hi')\n")
    (root / "models.py").write_text("def build(): ...\n")
    http, queue = service(tmp_path, allowed_roots=(root.resolve(),))
    outside = http.post("/api/jobs", json={"script": ["train.py"], "cwd": str(tmp_path)})
    assert outside.status_code == 403 and "outside the allowed roots" in outside.json()["detail"]
    escape = http.post(
        "/api/jobs", json={"script": ["../../train.py"], "cwd": str(root / "project")}
    )
    assert escape.status_code in (400, 403)
    relative = http.post("/api/jobs", json={"script": ["train.py"], "cwd": "shared/project"})
    assert relative.status_code == 400 and "absolute" in relative.json()["detail"]
    installed = http.post("/api/jobs", json={"workload": "subprocess:run"})
    assert (
        installed.status_code == 403 and "none of the allowed roots" in installed.json()["detail"]
    )
    assert queue.latest() == []
    script = http.post("/api/jobs", json={"script": ["train.py"], "cwd": str(root / "project")})
    assert script.status_code == 201, script.text
    user = http.post("/api/jobs", json={"workload": "models:build"})
    assert user.status_code == 201, user.text


def test_with_a_token_every_api_request_but_health_needs_it(tmp_path: Path) -> None:
    http, _ = service(tmp_path, token=TOKEN)
    assert http.get("/api/health").status_code == 200
    for method, path in [
        ("GET", "/api/jobs"),
        ("POST", "/api/jobs"),
        ("GET", "/api/jobs/x"),
        ("DELETE", "/api/jobs/x"),
        ("GET", "/api/studies"),  # optuna-dashboard's
        ("GET", "/api/openapi.json"),  # the schema, as the docs page
        ("GET", "/api/docs"),
    ]:
        refused = http.request(method, path)
        assert refused.status_code == 401, path
        assert refused.headers["www-authenticate"] == "Bearer"
    wrong = http.get("/api/jobs", headers={"Authorization": "Bearer nope"})
    assert wrong.status_code == 401
    right = {"Authorization": f"Bearer {TOKEN}"}
    assert http.get("/api/jobs", headers=right).status_code == 200
    assert http.get("/api/studies", headers=right).status_code == 200
    assert http.get("/api/openapi.json", headers=right).json()["info"]["title"] == "autotune"
    assert http.get("/openapi.json").status_code == 404  # nothing of the API outside /api
    assert http.get("/redoc").status_code == 404
    # The page's way in: its token as a cookie, which optuna-dashboard's page sends too.
    assert http.get("/").status_code == 200  # the page itself holds no data
    assert http.post("/api/session").status_code == 401
    session = http.post("/api/session", headers=right)
    assert session.status_code == 200 and TOKEN_COOKIE in session.cookies
    assert http.get("/api/jobs").status_code == 200  # the client keeps the cookie


def test_the_study_views_are_read_only(client: tuple[TestClient, JobQueue]) -> None:
    http, _ = client
    assert http.get("/api/studies").status_code == 200
    created = http.post("/api/studies", json={"study_name": "x", "directions": ["maximize"]})
    assert created.status_code == 405
    assert http.delete("/api/studies/1").status_code == 405


def test_a_loopback_service_without_a_token_answers_its_own_names_only(
    client: tuple[TestClient, JobQueue],
) -> None:
    http, _ = client
    assert http.get("/api/jobs", headers={"host": "localhost:8080"}).status_code == 200
    rebound = http.get("/api/jobs", headers={"host": "attacker.example"})
    assert rebound.status_code == 421


def test_a_token_shorter_than_16_characters_is_refused_at_start(tmp_path: Path) -> None:
    from autotune.service.settings import SettingsError

    with pytest.raises(SettingsError, match="the token has 15 characters: use at least 16"):
        ServiceSettings(token="x" * 15)
    ServiceSettings(token="x" * 16)


def test_the_job_list_is_paged_and_bounded(client: tuple[TestClient, JobQueue]) -> None:
    http, queue = client
    big = "x" * 4000  # the most an argument may hold
    ids = [
        queue.add({"workload": "mlp", "workload_args": {f"a{n}": big for n in range(200)}}).id
        for _ in range(7)
    ]
    first = http.get("/api/jobs", params={"limit": 3})
    assert [job["id"] for job in first.json()] == ids[::-1][:3]  # newest first
    assert len(first.content) < 3 * 4000  # not 3 × 800 KB: the list leaves requests out
    listed = first.json()[0]
    assert "request" not in listed and len(listed["args"]) <= 24
    assert all(len(value) <= 40 for value in listed["args"].values())
    assert f"before={ids[-3]}" in first.headers["link"]
    second = http.get("/api/jobs", params={"limit": 3, "before": ids[-3]}).json()
    last = http.get("/api/jobs", params={"limit": 3, "before": ids[-6]})
    assert [job["id"] for job in second] == ids[::-1][3:6]
    assert [job["id"] for job in last.json()] == ids[:1] and "link" not in last.headers
    assert http.get("/api/jobs", params={"limit": 500}).status_code == 422
    assert http.get("/api/jobs", params={"before": "nope"}).status_code == 404
    # The job itself still shows its whole request.
    assert http.get(f"/api/jobs/{ids[0]}").json()["request"]["workload_args"]["a0"] == big


def test_the_list_tells_jobs_of_one_workload_apart(client: tuple[TestClient, JobQueue]) -> None:
    http, _ = client
    for hidden in (64, 128):
        body = {"workload": "mlp", "workload_args": {"d_hidden": hidden}, "num_trials": 3}
        assert http.post("/api/jobs", json=body).status_code == 201
    listed = http.get("/api/jobs").json()
    assert [job["what"] for job in listed] == ["mlp × 2", "mlp × 2"]
    assert [job["args"] for job in listed] == [
        {"d_hidden": "128", "num_trials": "3"},
        {"d_hidden": "64", "num_trials": "3"},
    ]


def test_a_finished_job_is_deleted_with_its_results_kept_or_removed(tmp_path: Path) -> None:
    import optuna

    http, queue = service(tmp_path)
    settings = ServiceSettings(state_dir=tmp_path / "state", runner="local")
    jobs = []
    for name in ("kept", "removed"):
        job = queue.add({"workload": "mlp"})
        results = settings.jobs_dir.resolve() / f"mlp-{job.id}"
        results.mkdir(parents=True)
        (results / "job.log").write_text("the run's lines\n")
        study = optuna.create_study(study_name=name, storage=settings.storage_url)
        (results / "study.json").write_text(
            f'{{"storage": "{settings.storage_url}", "studies": {{"throughput": '
            f'"{study.study_name}"}}, "current": "throughput"}}'
        )
        assert queue.start(job.id, str(results), pid=None)
        jobs.append((job.id, results))
    running = jobs[0][0]
    conflict = http.delete(f"/api/jobs/{running}", params={"results": "keep"})
    assert conflict.status_code == 409 and "cancel it first" in conflict.json()["detail"]
    for job_id, _ in jobs:
        assert queue.finish(job_id, "succeeded")
    (kept_id, kept_dir), (removed_id, removed_dir) = jobs
    kept = http.delete(f"/api/jobs/{kept_id}", params={"results": "keep"}).json()
    assert kept == {"id": kept_id, "deleted": True, "results": "kept", "results_dir": str(kept_dir)}
    assert kept_dir.is_dir() and http.get(f"/api/jobs/{kept_id}").status_code == 404
    removed = http.delete(f"/api/jobs/{removed_id}", params={"results": "remove"}).json()
    assert removed["results"] == "removed" and not removed_dir.exists()
    names = [s.study_name for s in optuna.get_all_study_summaries(settings.storage_url)]
    assert names == ["kept"]  # the removed job's study went with its folder
    assert http.get("/api/jobs").json() == []
    assert http.delete(f"/api/jobs/{kept_id}", params={"results": "keep"}).status_code == 404
    assert http.delete("/api/jobs/x", params={"results": "all"}).status_code == 422
