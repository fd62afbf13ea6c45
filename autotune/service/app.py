"""The HTTP side of ``autotune serve``: the API, the token, the page and optuna-dashboard.

``/api/...`` is the service's API (FastAPI, thin over the queue); ``/`` is its page;
optuna-dashboard (a WSGI app) serves ``/dashboard`` and the routes its page calls
(``/api/studies``, ``/api/meta``, ...) over the same storage, read-only. One ASGI guard in
front of both (:class:`Guard`) checks the token, the ``Host`` header and the body's size
before any of them sees a request.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Awaitable, Callable, Mapping, MutableMapping
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

from fastapi import FastAPI, HTTPException, Query, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse, PlainTextResponse

import autotune
from autotune.runner.local import local_resources
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
from autotune.service.scheduler import LOG_NAME, job_environment
from autotune.service.settings import ServiceSettings, is_loopback, token_matches

if TYPE_CHECKING:
    import optuna

    from autotune.job import TuningJob

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
READ_ONLY_SCRIPT = "/assets/read-only.js"  # what hides optuna-dashboard's write buttons
# The job list, a page at a time: what every open page polls every few seconds.
PAGE_JOBS = 50
MAX_PAGE_JOBS = 200
# A listed job's request, shown flat and short: enough to tell jobs of one workload apart.
LISTED_ARGS = 24
LISTED_ARG_CHARS = 40
LISTED_ERROR_CHARS = 300


def create_app(
    settings: ServiceSettings,
    queue: JobQueue,
    storage: optuna.storages.BaseStorage,
    wake: Callable[[], None] = lambda: None,
    cluster_resources: Callable[[], Mapping[str, float]] = local_resources,
) -> Guard:
    """The service's ASGI application.

    Args:
        settings: how the service was started (its token, its allowed roots, its storage).
        queue: the job queue.
        storage: the Optuna storage every job's study is in.
        wake: called when the queue changed (the scheduler looks at it at once).
        cluster_resources: the CPUs and GPUs jobs run on, which a job's ranks must fit.
    """
    # The schema under /api, where the token guards it as it guards the docs page.
    api = FastAPI(
        title="autotune",
        version=autotune.__version__,
        docs_url="/api/docs",
        openapi_url="/api/openapi.json",
        redoc_url=None,
    )
    _errors_as_one_line(api)

    @api.get("/api/health")
    def health() -> dict[str, Any]:
        return {"status": "ok", "version": autotune.__version__}

    @api.post("/api/jobs", status_code=201)
    def submit(body: JobRequest) -> dict[str, Any]:
        """Queue a job, or answer it at once from a finished one with the same key."""
        check_request(
            body,
            settings.allowed_roots,
            allow_installed_modules=settings.allow_installed_modules,
            resources=cluster_resources(),
            environment=job_environment(settings),
        )
        given = body.model_dump(mode="json", exclude_defaults=True)
        key, answer = None, None
        if body.script is None:  # a script's key needs its folder: its job finds it
            key = _key(body, settings)
            answer = None if body.force else _answer(queue, storage, key)
        else:  # its config and flags are checked now all the same
            _tuning_job(body.model_copy(update={"script": None}), settings)
        job = queue.add(given, key, answer=answer)
        wake()
        return {"id": job.id, "status": job.status, "cached": job.cached}

    @api.get("/api/jobs")
    def jobs(
        response: Response,
        limit: Annotated[int, Query(ge=1, le=MAX_PAGE_JOBS)] = PAGE_JOBS,
        before: Annotated[str | None, Query(max_length=64)] = None,
    ) -> list[dict[str, Any]]:
        """The jobs, newest first, a page at a time: the next page is the jobs before the
        last one listed (``?before=ID``, also in the ``Link`` header)."""
        page = queue.latest(limit + 1, _job(queue, before) if before else None)
        if len(page) > limit:
            page = page[:limit]
            response.headers["link"] = f'</api/jobs?limit={limit}&before={page[-1].id}>; rel="next"'
        return [job_summary(job, storage) for job in page]

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
    def cancel_or_delete(
        job_id: str, results: Literal["keep", "remove"] | None = None
    ) -> dict[str, Any]:
        """Without ``results``: cancel, a queued job at once, a running one once its
        experiments have stopped. With it: delete a finished job from the list, its results
        directory and study kept or removed."""
        found = _job(queue, job_id)
        if results is None:
            queue.cancel(job_id)
            wake()
            return job_view(_job(queue, job_id), storage)
        if found.status not in FINISHED:
            raise HTTPException(
                409, f"job {job_id} is {found.status}: cancel it first (DELETE without ?results)"
            )
        deleted = queue.delete(job_id)
        assert deleted is not None  # a finished job stays finished
        removed = results == "remove" and _remove_results(deleted, settings)
        return {
            "id": job_id,
            "deleted": True,
            "results": "removed" if removed else "kept",
            "results_dir": None if removed else deleted.results_dir,
        }

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

    @api.get(READ_ONLY_SCRIPT)
    def read_only_script() -> Response:
        script = resources.files("autotune.service").joinpath("read_only.js").read_text()
        return Response(script, media_type="text/javascript")

    dashboard = _dashboard(storage)
    hosts = None if settings.token is not None else _loopback_hosts(settings)
    return Guard(api, dashboard, settings.token, hosts)


# --- the views --------------------------------------------------------------------------------


def job_view(job: Job, storage: optuna.storages.BaseStorage) -> dict[str, Any]:
    """A job as the API shows it: ``id``, ``status``, ``experiments`` (run so far), ``best``
    (``name``, ``value``, ``metric``, ``ds_config``; None before an answer), ``cached``,
    ``error``, and what the page shows besides."""
    study = _study_name(job)
    warm = dict(job.warm_start or {})
    warm.pop("cost_model", None)  # the constants themselves are the profile's to show
    return {
        **job_summary(job, storage, study),
        "best": {**job.best, **_metric(job)} if job.best else None,
        "error": job.error,
        "cached_from": job.cached_from,
        "request": dict(job.request),
        "command": job.command,
        "study": study,
        "dashboard": _dashboard_path(storage, study),
        "warm_start": warm or None,
        "starts": job.starts,
    }


def job_summary(
    job: Job, storage: optuna.storages.BaseStorage, study: str | None = None
) -> dict[str, Any]:
    """A job as the list shows it, bounded in size whatever its request holds: what it
    tunes (``what``, and ``args``: its arguments, flags and config keys, flat and cut
    short), how it stands, its answer's name and value; :func:`job_view` has the rest."""
    experiments = job.experiments
    if experiments is None and job.status != "queued":  # running, or ended without a summary
        study = study or _study_name(job)
        experiments = _finished_trials(storage, study) if study is not None else 0
    best = None
    if job.best:
        best = {"name": job.best.get("name"), "value": job.best.get("value"), **_metric(job)}
    error = job.error
    if error is not None and len(error) > LISTED_ERROR_CHARS:
        error = error[: LISTED_ERROR_CHARS - 1] + "…"
    return {
        "id": job.id,
        "status": job.status,
        "experiments": experiments or 0,
        "best": best,
        "cached": job.cached,
        "error": error,
        "cancel_requested": job.cancel_requested and job.status not in FINISHED,
        "what": _what(job.request),
        "args": request_args(job.request),
        "running": list(job.running) if job.status == "running" else [],
        "created_at": job.created_at,
        "started_at": job.started_at,
        "experiment_started_at": job.experiment_started_at,
        "finished_at": job.finished_at,
    }


def request_args(request: Mapping[str, Any]) -> dict[str, str]:
    """What a request sets beyond its workload, flat: each workload argument by its name,
    each flag, each config key (dotted), its value as short JSON text; at most
    :data:`LISTED_ARGS` of them (the rest counted under ``"…"``).

    Example:
        >>> request_args({"workload": "mlp", "workload_args": {"d_hidden": 128},
        ...               "config": {"zero_optimization": {"stage": [1, 2]}}, "seed": 3})
        {'d_hidden': '128', 'zero_optimization.stage': '[1, 2]', 'seed': '3'}
    """
    flat: dict[str, Any] = {}
    for key, value in request.items():
        if key in ("workload", "script", "cwd"):
            continue
        if key == "workload_args" and isinstance(value, Mapping):
            flat.update(value)
        elif key == "config" and isinstance(value, Mapping):
            flat.update(_leaves(value))
        else:
            flat[key] = value
    shown = {key[:LISTED_ARG_CHARS]: _short(json.dumps(value)) for key, value in flat.items()}
    if len(shown) > LISTED_ARGS:
        kept = dict(list(shown.items())[: LISTED_ARGS - 1])
        return {**kept, "…": f"{len(shown) - len(kept)} more"}
    return shown


def _leaves(config: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    leaves: dict[str, Any] = {}
    for key, value in config.items():
        if isinstance(value, Mapping) and value:
            leaves.update(_leaves(value, f"{prefix}{key}."))
        else:
            leaves[f"{prefix}{key}"] = value
    return leaves


def _short(text: str) -> str:
    return text if len(text) <= LISTED_ARG_CHARS else text[: LISTED_ARG_CHARS - 1] + "…"


def _what(request: Mapping[str, Any]) -> str:
    """What a job tunes, in a few words: ``mlp × 2``, ``script train.py × 4``."""
    from autotune.defaults import DEFAULT_WORKLOAD, DEFAULT_WORLD_SIZE

    world = request.get("world_size", DEFAULT_WORLD_SIZE)
    script = request.get("script")
    if script:
        return _short("script " + " ".join(str(arg) for arg in script[:2])) + f" × {world}"
    return f"{_short(str(request.get('workload', DEFAULT_WORKLOAD)))} × {world}"


def _metric(job: Job) -> dict[str, str]:
    """What the job's answer's value measures (``metric``) and in what (``unit``): as its job
    said, else as it asked."""
    from autotune.metric import Metric

    said = (job.best or {}).get("metric") or job.request.get("metric")
    config = job.request.get("config") or {}
    tuning = config.get("autotuning") if isinstance(config, Mapping) else None
    if said is None and isinstance(tuning, Mapping):
        said = tuning.get("metric")
    try:
        metric = Metric(str(said or Metric.throughput.value).lower())
    except ValueError:  # a config the job itself refused
        return {"metric": str(said), "unit": ""}
    return {"metric": metric.value, "unit": metric.unit}


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
    job = _tuning_job(body, settings)
    return knowledge.job_key(job, knowledge.this_hardware().id, placement(body))


def _tuning_job(body: JobRequest, settings: ServiceSettings) -> TuningJob:
    """The job ``autotune run`` would assemble (its config loaded and checked).

    Raises:
        RequestError: the config or a flag breaks a rule (the key named).
    """
    from autotune.config import ConfigError

    try:
        return tuning_job(
            body, settings.jobs_dir / "new", settings.storage_url, settings.allowed_roots
        )
    except ConfigError as err:
        raise RequestError(str(err)) from None


def _remove_results(job: Job, settings: ServiceSettings) -> bool:
    """Remove a deleted job's results directory and its study (a job answered from another
    holds none of its own); whether anything was removed."""
    from autotune.results.study import RunStudy

    if job.cached or job.results_dir is None:
        return False
    folder = Path(job.results_dir)
    if settings.jobs_dir.resolve() not in folder.resolve().parents:
        return False  # not the service's to remove
    RunStudy(folder).delete()
    shutil.rmtree(folder, ignore_errors=True)
    return True


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
        if to_dashboard and method == "GET":
            send = _read_only_pages(send)
        await (self.dashboard if to_dashboard else self.api)(scope, replay, send)

    def _authorized(self, headers: dict[str, str]) -> bool:
        assert self.token is not None
        scheme, _, given = headers.get("authorization", "").partition(" ")
        if scheme.lower() == "bearer" and token_matches(given.strip(), self.token):
            return True
        return token_matches(_cookie(headers.get("cookie", ""), TOKEN_COOKIE), self.token)


_CHALLENGE = [(b"www-authenticate", b"Bearer")]


def _read_only_pages(send: Send) -> Send:
    """``send`` with :data:`READ_ONLY_SCRIPT` put into every HTML page: optuna-dashboard's
    buttons that write are hidden, since the guard refuses what they send (its data, in
    JSON, passes as it is). A script of the service's own origin: the dashboard's pages
    allow no inline one."""
    script = f'<script src="{READ_ONLY_SCRIPT}"></script>'.encode()
    start: Message | None = None
    chunks: list[bytes] = []

    async def sending(message: Message) -> None:
        nonlocal start
        if message["type"] == "http.response.start":
            said = {k.lower(): v for k, v in message.get("headers", [])}
            if said.get(b"content-type", b"").startswith(b"text/html"):
                start = message  # held until the whole page is here
                return
        elif message["type"] == "http.response.body" and start is not None:
            chunks.append(message.get("body", b""))
            if message.get("more_body", False):
                return
            page = b"".join(chunks).replace(b"</head>", script + b"</head>", 1)
            # Its length changed, and it is no longer the file its validators name.
            headers = [
                (k, v)
                for k, v in start.get("headers", [])
                if k.lower() not in (b"content-length", b"etag", b"last-modified")
            ]
            await send(
                {**start, "headers": [*headers, (b"content-length", str(len(page)).encode())]}
            )
            await send({"type": "http.response.body", "body": page})
            return
        await send(message)

    return sending


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
