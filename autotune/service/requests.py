"""A job as asked over HTTP (``POST /api/jobs``, ``autotune submit``), validated before
anything is written or started.

The fields are ``autotune run``'s flags, each meaning what the flag means; one left out means
what ``run`` does without it. What a job may name on the cluster's file system is bounded:
a script's working directory, and a user workload's module, must lie inside a root the
service allows (``--allow-root``); built-in workloads need none. Nothing a request holds goes
through a shell: a script's argv is passed as a list.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from autotune.config import EngineName, Metric, TunerType
from autotune.defaults import DEFAULT_CPUS_PER_RANK, DEFAULT_WORKLOAD, DEFAULT_WORLD_SIZE

if TYPE_CHECKING:
    from autotune.job import TuningJob

MAX_BODY_BYTES = 1 << 20  # a config and a script's argv fit many times over
_MAX_ARG_CHARS = 4096
_IDENTIFIER = r"[A-Za-z_]\w*"
_USER_WORKLOAD = re.compile(rf"(?P<module>{_IDENTIFIER}(?:\.{_IDENTIFIER})*):{_IDENTIFIER}")
_BUILTIN_OR_HF = re.compile(r"(hf:)?[A-Za-z0-9_][\w.\-/]*")

ArgValue = str | int | float | bool | None
_Arg = Annotated[str, Field(max_length=_MAX_ARG_CHARS)]


class RequestError(ValueError):
    """A request that cannot run (one line); ``status`` is the HTTP status it is answered
    with."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


class JobRequest(BaseModel):
    """What a job asks for: ``autotune run``'s flags (see ``autotune run --help``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    config: dict[str, Any] | None = None
    workload: Annotated[str, Field(min_length=1, max_length=256)] = DEFAULT_WORKLOAD
    workload_args: dict[Annotated[str, Field(max_length=128)], ArgValue] = Field(
        default_factory=dict, max_length=256
    )
    world_size: Annotated[int, Field(ge=1, le=65536)] = DEFAULT_WORLD_SIZE
    metric: Metric | None = None
    tuner: TunerType | None = None
    engine: EngineName | None = None
    device_memory: Annotated[str, Field(max_length=32)] | Annotated[int, Field(gt=0)] | None = None
    fast: bool | None = None
    num_trials: Annotated[int, Field(ge=1)] | None = None
    early_stopping: Annotated[int, Field(ge=1)] | None = None
    start_profile_step: Annotated[int, Field(ge=1)] | None = None
    end_profile_step: Annotated[int, Field(ge=1)] | None = None
    timeout: Annotated[float, Field(ge=1)] | None = None
    time_budget: Annotated[float, Field(gt=0)] | None = None
    seed: int | None = None
    cpus_per_rank: Annotated[int, Field(ge=1, le=1024)] = DEFAULT_CPUS_PER_RANK
    gpus_per_rank: Annotated[float, Field(ge=0, le=64)] | None = None
    max_concurrent: Annotated[int, Field(ge=1)] | None = None
    script: Annotated[list[_Arg], Field(min_length=1, max_length=512)] | None = None
    cwd: Annotated[str, Field(max_length=_MAX_ARG_CHARS)] | None = None
    force: bool = False

    @field_validator("script")
    @classmethod
    def _plain_arguments(cls, script: list[str] | None) -> list[str] | None:
        for arg in script or ():
            if "\x00" in arg:
                raise ValueError("an argument holds a NUL byte")
        return script

    def autotuning(self) -> dict[str, Any]:
        """The keys of the config's ``autotuning`` section the request sets."""
        keys = {
            "metric": self.metric,
            "tuner_type": self.tuner,
            "engine": self.engine,
            "fast": self.fast,
            "tuner_num_trials": self.num_trials,
            "tuner_early_stopping": self.early_stopping,
            "start_profile_step": self.start_profile_step,
            "end_profile_step": self.end_profile_step,
            "timeout_s": self.timeout,
            "time_budget_s": self.time_budget,
            "seed": self.seed,
        }
        return {key: value for key, value in keys.items() if value is not None}

    def tune_kwargs(self) -> dict[str, Any]:
        """:func:`autotune.api.tune`'s keyword arguments for this request (the results
        directory, storage, runner and Ray address are the service's to add)."""
        return {
            "config": self.config,
            "workload": self.workload,
            "workload_args": dict(self.workload_args),
            "world_size": self.world_size,
            "device_memory": self.device_memory,
            "script": list(self.script) if self.script else None,
            "cpus_per_rank": self.cpus_per_rank,
            "gpus_per_rank": self.gpus_per_rank,
            "max_concurrent": self.max_concurrent,
            **self.autotuning(),
        }

    def label(self) -> str:
        """What it tunes, for a folder's name: the workload, or the script's file."""
        if self.script:
            name = self.script[1] if self.script[0] == "-m" and len(self.script) > 1 else None
            return _slug(name or Path(self.script[0]).stem)
        return _slug(self.workload)


def check_request(request: JobRequest, allowed_roots: tuple[Path, ...]) -> None:
    """What a request may name on this machine, checked before anything is written.

    Raises:
        RequestError: a script without ``cwd``, a ``cwd`` or user workload outside the
            allowed roots, a workload spec that is none, a config that is not an object.
    """
    if request.script is not None or request.cwd is not None:
        if request.script is None:
            raise RequestError("cwd is for a script job: give script too")
        if request.cwd is None:
            raise RequestError("a script job needs cwd: the folder the script runs in")
        cwd = inside_roots(request.cwd, allowed_roots, "cwd")
        if request.script[0] != "-m":
            script = (cwd / request.script[0]).resolve()
            if not _is_inside(script, (cwd, *allowed_roots)):
                raise RequestError(f"script {request.script[0]!r} is outside cwd", 403)
            if not script.is_file():
                raise RequestError(f"script {request.script[0]!r} does not exist in {cwd}")
        return
    workload = request.workload
    user = _USER_WORKLOAD.fullmatch(workload)
    if user is None and (
        ":" in workload.removeprefix("hf:") or not _BUILTIN_OR_HF.fullmatch(workload)
    ):
        raise RequestError(
            f"workload {workload!r}: expected a built-in name, hf:<model_type>, or "
            "package.module:function"
        )
    if user is not None:
        # A user workload is imported in every rank: only from a folder the service allows
        # (never a module installed on the cluster, such as os or subprocess).
        if not allowed_roots:
            raise RequestError(
                f"workload {workload!r}: this service runs built-in workloads only (start it "
                "with --allow-root DIR to allow workloads from DIR)",
                403,
            )
        top = user["module"].split(".")[0]
        if not any(
            (root / top).is_dir() or (root / f"{top}.py").is_file() for root in allowed_roots
        ):
            raise RequestError(
                f"workload {workload!r}: module {top!r} is in none of the allowed roots "
                f"({', '.join(str(r) for r in allowed_roots)})",
                403,
            )


def inside_roots(path: str, allowed_roots: tuple[Path, ...], what: str) -> Path:
    """``path`` resolved (links followed), if it is an existing folder inside an allowed root.

    Raises:
        RequestError: it is relative, missing, or outside every allowed root (403).
    """
    if not allowed_roots:
        raise RequestError(
            "this service runs no scripts (start it with --allow-root DIR to allow scripts in DIR)",
            403,
        )
    if not os.path.isabs(path):
        raise RequestError(f"{what} {path!r}: give an absolute path")
    resolved = Path(path).resolve()
    if not _is_inside(resolved, allowed_roots):
        raise RequestError(f"{what} {path!r} is outside the allowed roots", 403)
    if not resolved.is_dir():
        raise RequestError(f"{what} {path!r} is not a folder")
    return resolved


def user_workload_root(workload: str, allowed_roots: tuple[Path, ...]) -> Path | None:
    """The allowed root a user workload's module is imported from (None: a built-in)."""
    user = _USER_WORKLOAD.fullmatch(workload)
    if user is None:
        return None
    top = user["module"].split(".")[0]
    for root in allowed_roots:
        if (root / top).is_dir() or (root / f"{top}.py").is_file():
            return root
    return None


def _is_inside(path: Path, roots: tuple[Path, ...]) -> bool:
    return any(path == root.resolve() or root.resolve() in path.parents for root in roots)


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", text).strip("-.")[:40] or "job"


def tuning_job(request: JobRequest, results_dir: Path, storage: str) -> TuningJob:
    """The :class:`~autotune.job.TuningJob` ``autotune run`` would assemble for ``request``
    (its config loaded and checked, nothing run), with the service's results directory and
    storage: what :func:`autotune.service.knowledge.job_key` keys.

    Raises:
        ConfigError, ScriptError: as :func:`autotune.api.load_job`.
    """
    from autotune.api import RunRequest, load_job

    return load_job(
        RunRequest(
            config=request.config,
            autotuning={
                **request.autotuning(),
                "results_dir": str(results_dir),
                "storage": storage,
            },
            world_size=request.world_size,
            workload=request.workload,
            workload_args=dict(request.workload_args),
            device_memory=request.device_memory,
            script=request.script,
            cpus_per_rank=request.cpus_per_rank,
            names=_FIELD_NAMES,
        )
    )


def placement(request: JobRequest) -> dict[str, Any]:
    """What a job's ranks hold, which changes what is measured (part of its key)."""
    return {"cpus_per_rank": request.cpus_per_rank, "gpus_per_rank": request.gpus_per_rank}


# How an error names a request's field: by its JSON name (autotuning key → field).
_FIELD_NAMES = {
    "metric": "metric",
    "tuner_type": "tuner",
    "engine": "engine",
    "fast": "fast",
    "tuner_num_trials": "num_trials",
    "tuner_early_stopping": "early_stopping",
    "start_profile_step": "start_profile_step",
    "end_profile_step": "end_profile_step",
    "timeout_s": "timeout",
    "time_budget_s": "time_budget",
    "seed": "seed",
    "device_memory": "device_memory",
    "config": "config",
}
