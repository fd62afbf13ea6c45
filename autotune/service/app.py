"""The HTTP side of ``autotune serve``: the API, the token, the page and optuna-dashboard.

``/api/...`` is the service's API (FastAPI, thin over the queue); ``/`` is its page;
optuna-dashboard (a WSGI app) serves ``/dashboard`` and the routes its page calls
(``/api/studies``, ``/api/meta``, ...) over the same storage, read-only. One ASGI guard in
front of both (:class:`Guard`) checks the token, the ``Host`` header and the body's size
before any of them sees a request.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, MutableMapping
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fastapi import FastAPI, HTTPException, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse, PlainTextResponse

import autotune
from autotune.service import knowledge
from autotune.service.queue import FINISHED, Job, JobQueue
from autotune.service.requests import (
    MAX_BODY_BYTES,
    JobRequest,
    RequestError,
    check_request,
    placement,
    tuning_job,
)
from autotune.service.scheduler import LOG_NAME
from autotune.service.settings import ServiceSettings, is_loopback, token_matches

if TYPE_CHECKING:
    import optuna

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

TOKEN_COOKIE = "autotune_token"
# optuna-dashboard's routes: its page asks for these at the server's root.
DASHBOARD_PREFIXES = ("/dashboard", "/static/", "/favicon.ico", "/csv/")
DASHBOARD_API = ("/api/meta", "/api/studies", "/api/trials")
PUBLIC_API = ("/api/health",)
JSON_BODIES = ("/api/jobs",)
LOG_TAIL_BYTES = 64 * 1024


def create_app(
    settings: ServiceSettings,
    queue: JobQueue,
    storage: optuna.storages.BaseStorage,
    wake: Callable[[], None] = lambda: None,
) -> Guard:
    """The service's ASGI application.

    Args:
        settings: how the service was started (its token, its allowed roots, its storage).
        queue: the job queue.
        storage: the Optuna storage every job's study is in.
        wake: called when the queue changed (the scheduler looks at it at once).
    """
    api = FastAPI(title="autotune", version=autotune.__version__, docs_url="/api/docs")
    _errors_as_one_line(api)

    @api.get("/api/health")
    def health() -> dict[str, Any]:
        return {"status": "ok", "version": autotune.__version__}

    @api.post("/api/jobs", status_code=201)
    def submit(body: JobRequest) -> dict[str, Any]:
        """Queue a job, or answer it at once from a finished one with the same key."""
        check_request(body, settings.allowed_roots)
        given = body.model_dump(mode="json", exclude_defaults=True)
        key, answer = None, None
        if body.script is None:  # a script's key needs its folder: its job finds it
            key = _key(body, settings)
            answer = None if body.force else _answer(queue, storage, key)
        job = queue.add(given, key, answer=answer)
        wake()
        return {"id": job.id, "status": job.status, "cached": job.cached}

    @api.get("/api/jobs")
    def jobs() -> list[dict[str, Any]]:
        return [job_view(job, storage) for job in queue.latest()]

    @api.get("/api/jobs/{job_id}")
    def job(job_id: str) -> dict[str, Any]:
        return job_view(_job(queue, job_id), storage)

    @api.get("/api/jobs/{job_id}/experiments")
    def experiments(job_id: str) -> list[dict[str, Any]]:
        """The job's experiments as they finish (a cached job: its answer's)."""
        found = _job(queue, job_id)
        source = queue.get(found.cached_from) if found.cached_from else found
        if source is None or source.results_dir is None:
            return []
        return experiment_rows(Path(source.results_dir))

    @api.get("/api/jobs/{job_id}/log", response_class=PlainTextResponse)
    def log(job_id: str) -> str:
        """The end of the job's log (its process's output: the run's lines, any error)."""
        found = _job(queue, job_id)
        if found.results_dir is None:
            return ""
        path = Path(found.results_dir) / LOG_NAME
        try:
            with path.open("rb") as handle:
                handle.seek(max(0, path.stat().st_size - LOG_TAIL_BYTES))
                return handle.read().decode(errors="replace")
        except OSError:
            return ""

    @api.delete("/api/jobs/{job_id}")
    def cancel(job_id: str) -> dict[str, Any]:
        """Cancel: a queued job at once, a running one once its experiments have stopped."""
        _job(queue, job_id)
        queue.cancel(job_id)
        wake()
        return job_view(_job(queue, job_id), storage)

    @api.post("/api/session")
    def session(response: Response) -> dict[str, Any]:
        """The page's log-in: the token (checked by the guard) as a cookie, so that the
        page and optuna-dashboard's, which cannot send a header, are let in."""
        if settings.token is not None:
            response.set_cookie(
                TOKEN_COOKIE, settings.token, httponly=True, samesite="strict", path="/"
            )
        return {"token_required": settings.token is not None}

    @api.get("/", response_class=HTMLResponse)
    def page() -> str:
        return resources.files("autotune.service").joinpath("page.html").read_text()

    dashboard = _dashboard(storage)
    hosts = None if settings.token is not None else _loopback_hosts(settings)
    return Guard(api, dashboard, settings.token, hosts)


# --- the views --------------------------------------------------------------------------------


def job_view(job: Job, storage: optuna.storages.BaseStorage) -> dict[str, Any]:
    """A job as the API shows it: ``id``, ``status``, ``experiments`` (run so far), ``best``
    (``name``, ``value``, ``ds_config``; None before an answer), ``cached``, ``error``, and
    what the page shows besides."""
    study = _study_name(job)
    experiments = job.experiments
    if experiments is None and study is not None:  # running, or stopped before its summary
        experiments = _finished_trials(storage, study)
    warm = dict(job.warm_start or {})
    warm.pop("cost_model", None)  # the constants themselves are the profile's to show
    return {
        "id": job.id,
        "status": job.status,
        "experiments": experiments or 0,
        "best": dict(job.best) if job.best else None,
        "cached": job.cached,
        "error": job.error,
        "cached_from": job.cached_from,
        "cancel_requested": job.cancel_requested and job.status not in FINISHED,
        "request": dict(job.request),
        "command": job.command,
        "study": study,
        "dashboard": _dashboard_path(storage, study),
        "warm_start": warm or None,
        "created_at": job.created_at,
        "started_at": job.started_at,
        "finished_at": job.finished_at,
        "starts": job.starts,
    }


def experiment_rows(results_dir: Path) -> list[dict[str, Any]]:
    """Each finished experiment of a results directory, in the order they finished."""
    from autotune.results import ResultsDir

    rows = []
    for record in ResultsDir(results_dir).records():
        metrics = record.get("metrics") or {}
        zero = (record.get("ds_config") or {}).get("zero_optimization") or {}
        rows.append(
            {
                "name": record.get("name"),
                "status": record.get("status"),
                "zero_stage": zero.get("stage", 0),
                "micro_batch_size": (record.get("ds_config") or {}).get(
                    "train_micro_batch_size_per_gpu"
                ),
                "throughput": metrics.get("throughput"),
                "latency": metrics.get("latency"),
                "peak_memory_bytes": metrics.get("peak_memory_bytes"),
                "error": record.get("error"),
            }
        )
    return rows


def _study_name(job: Job) -> str | None:
    if job.study and job.study.get("name"):
        return str(job.study["name"])
    if job.results_dir is None:
        return None
    from autotune.results.study import RunStudy

    info = RunStudy(Path(job.results_dir)).info()
    return (info.get("studies") or {}).get(str(info.get("current")))


def _finished_trials(storage: optuna.storages.BaseStorage, study: str) -> int:
    from optuna.trial import TrialState

    try:
        study_id = storage.get_study_id_from_name(study)
    except KeyError:
        return 0
    done = (TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL)
    return len(storage.get_all_trials(study_id, deepcopy=False, states=done))


def _dashboard_path(storage: optuna.storages.BaseStorage, study: str | None) -> str | None:
    if study is None:
        return None
    try:
        return f"/dashboard/studies/{storage.get_study_id_from_name(study)}"
    except KeyError:
        return None


def _job(queue: JobQueue, job_id: str) -> Job:
    found = queue.get(job_id)
    if found is None:
        raise HTTPException(404, f"no job {job_id}")
    return found


def _key(body: JobRequest, settings: ServiceSettings) -> str:
    from autotune.config import ConfigError

    try:
        job = tuning_job(body, settings.jobs_dir / "new", settings.storage_url)
    except ConfigError as err:
        raise RequestError(str(err)) from None
    return knowledge.job_key(job, knowledge.this_hardware().id, placement(body))


def _answer(queue: JobQueue, storage: optuna.storages.BaseStorage, key: str) -> Job | None:
    """The finished job whose answer is this key's: this service's, else one in the storage
    (another service sharing the database)."""
    local = queue.answered(key)
    if local is not None:
        return local
    entry = knowledge.answer_for(storage, key)
    if entry is None:
        return None
    return Job(
        id=str(entry["job"]),
        seq=0,
        request={},
        status="succeeded",
        best=entry["best"],
        study={"name": entry["study"]},
        command=entry.get("command"),
    )


def _errors_as_one_line(api: FastAPI) -> None:
    """Every error is ``{"detail": "one line"}``, validation errors included."""

    @api.exception_handler(RequestValidationError)
    async def invalid(request: Request, err: RequestValidationError) -> JSONResponse:
        first = err.errors()[0]
        where = ".".join(str(part) for part in first.get("loc", ()) if part != "body")
        message = str(first.get("msg", "invalid")).removeprefix("Value error, ")
        if first.get("type") == "extra_forbidden":
            message = "unknown field"
        if first.get("type") == "json_invalid":
            where, message = "", "the body is not JSON"
        return JSONResponse({"detail": f"{where}: {message}" if where else message}, 422)

    @api.exception_handler(RequestError)
    async def refused(request: Request, err: RequestError) -> JSONResponse:
        return JSONResponse({"detail": str(err)}, err.status)


def _dashboard(storage: optuna.storages.BaseStorage) -> ASGIApp:
    from a2wsgi import WSGIMiddleware
    from optuna_dashboard import wsgi

    return WSGIMiddleware(wsgi(storage))  # type: ignore[return-value]


def _loopback_hosts(settings: ServiceSettings) -> set[str] | None:
    """The ``Host`` headers a loopback service without a token answers: its own names only,
    so that a web page whose name was rebound to 127.0.0.1 cannot use it."""
    if not is_loopback(settings.host):
        return None
    names = {"127.0.0.1", "localhost", "[::1]", settings.host}
    return names | {f"{name}:{settings.port}" for name in names}


class Guard:
    """In front of the API and the dashboard: the token, the ``Host`` header, the body's
    size, and the dashboard kept read-only (the record is changed by jobs, not by hand)."""

    def __init__(
        self, api: ASGIApp, dashboard: ASGIApp, token: str | None, hosts: set[str] | None
    ) -> None:
        self.api = api
        self.dashboard = dashboard
        self.token = token
        self.hosts = hosts

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.api(scope, receive, send)
            return
        path, method = scope["path"], scope["method"]
        headers = {k.decode("latin1").lower(): v.decode("latin1") for k, v in scope["headers"]}
        to_dashboard = path.startswith(DASHBOARD_PREFIXES) or path.startswith(DASHBOARD_API)
        if self.hosts is not None and headers.get("host", "") not in self.hosts:
            await _answer_json(send, 421, "this service answers requests to its own address")
            return
        needs_token = (path.startswith("/api/") and path not in PUBLIC_API) or path.startswith(
            "/csv/"
        )
        if self.token is not None and needs_token and not self._authorized(headers):
            await _answer_json(
                send, 401, "a token is needed: Authorization: Bearer <token>", _CHALLENGE
            )
            return
        content_type = headers.get("content-type", "")
        if (
            method == "POST"
            and path in JSON_BODIES
            and not content_type.startswith("application/json")
        ):
            # Also what keeps another site's form out: JSON needs a preflight it won't get.
            await _answer_json(send, 415, "send JSON (Content-Type: application/json)")
            return
        if to_dashboard and method not in ("GET", "HEAD"):
            await _answer_json(send, 405, "the study views are read-only: jobs change the record")
            return
        length = headers.get("content-length")
        if length is not None and (not length.isdigit() or int(length) > MAX_BODY_BYTES):
            await _answer_json(send, 413, f"the body is over {MAX_BODY_BYTES} bytes")
            return
        body = await _bounded_body(receive)
        if body is None:
            await _answer_json(send, 413, f"the body is over {MAX_BODY_BYTES} bytes")
            return
        replay = _replay(body, receive)
        await (self.dashboard if to_dashboard else self.api)(scope, replay, send)

    def _authorized(self, headers: dict[str, str]) -> bool:
        assert self.token is not None
        scheme, _, given = headers.get("authorization", "").partition(" ")
        if scheme.lower() == "bearer" and token_matches(given.strip(), self.token):
            return True
        return token_matches(_cookie(headers.get("cookie", ""), TOKEN_COOKIE), self.token)


_CHALLENGE = [(b"www-authenticate", b"Bearer")]


async def _bounded_body(receive: Receive) -> bytes | None:
    """The request's body, or None past :data:`MAX_BODY_BYTES` (a body sent in chunks, with
    no length said, is bounded too)."""
    chunks, size = [], 0
    while True:
        message = await receive()
        if message["type"] != "http.request":
            break
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > MAX_BODY_BYTES:
            return None
        chunks.append(chunk)
        if not message.get("more_body", False):
            break
    return b"".join(chunks)


def _replay(body: bytes, receive: Receive) -> Receive:
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()  # the client's disconnect

    return replay


async def _answer_json(
    send: Send, status: int, detail: str, headers: list[tuple[bytes, bytes]] | None = None
) -> None:
    body = json.dumps({"detail": detail}).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                *(headers or []),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


def _cookie(header: str, name: str) -> str | None:
    for part in header.split(";"):
        key, _, value = part.strip().partition("=")
        if key == name:
            return value
    return None
