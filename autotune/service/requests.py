"""A job as asked over HTTP (``POST /api/jobs``, ``autotune submit``), validated before
anything is written or started.

The fields are ``autotune run``'s flags, each meaning what the flag means; one left out means
what ``run`` does without it. The fields' own rules (types, ranges: a seed NumPy takes, no
``Infinity``) are the model's; :func:`check_request` checks what needs the service: the code
a job names (a script's working directory and file, a ``-m`` module, a user workload's module)
must resolve inside a root the service allows (``--allow-root``;
:mod:`autotune.service.imports` finds where), a built-in or ``hf:`` workload must exist and
take the arguments given, and the ranks must fit the cluster. Nothing a request holds goes
through a shell: a script's argv is passed as a list.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

from pydantic import Field

from autotune.defaults import DEFAULT_WORLD_SIZE
from autotune.run_options import MAX_ARG_CHARS, ArgValue, RunOptions, TuningOptions, option
from autotune.service.imports import import_problem_for_job, is_inside
from autotune.workloads.args import did_you_mean

if TYPE_CHECKING:
    from autotune.job import TuningJob

MAX_BODY_BYTES = 1 << 20  # a config and a script's argv fit many times over
_IDENTIFIER = r"[A-Za-z_]\w*"
_DOTTED = rf"{_IDENTIFIER}(?:\.{_IDENTIFIER})*"
_MODULE = re.compile(_DOTTED)
_USER_WORKLOAD = re.compile(rf"(?P<module>{_DOTTED}):{_IDENTIFIER}")
_BUILTIN = re.compile(r"[A-Za-z0-9_][\w\-]*")
# transformers' model types: gpt2, deberta-v2, xlm-roberta, kosmos-2.5; no path in them.
_HF_MODEL_TYPE = re.compile(r"[A-Za-z0-9]+(?:[._-][A-Za-z0-9]+)*")


class RequestError(ValueError):
    """A request that cannot run (one line); ``status`` is the HTTP status it is answered
    with."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


class JobRequest(TuningOptions):
    """What a job asks for: ``autotune run``'s options (:class:`TuningOptions`, each meaning
    what its flag means), its config as data, and a script's working directory."""

    config: dict[str, Any] | None = option(None, "The DeepSpeed config (sent).")
    cwd: Annotated[str, Field(max_length=MAX_ARG_CHARS)] | None = option(
        None, "Script mode: the folder the script runs in."
    )
    force: bool = option(False, "Tune again even if the same job was answered.")

    def tune_kwargs(self) -> dict[str, Any]:
        """:func:`autotune.api.tune`'s keyword arguments for this request (the results
        directory, storage, runner and Ray address are the service's to add)."""
        shared = self.model_dump(include=set(TuningOptions.model_fields), exclude_none=True)
        return {"config": self.config, **shared}

    def label(self) -> str:
        """What it tunes, for a folder's name: the workload, or the script's file."""
        if self.script:
            name = self.script[1] if self.script[0] == "-m" and len(self.script) > 1 else None
            return _slug(name or Path(self.script[0]).stem)
        return _slug(self.workload)


def check_request(
    request: JobRequest,
    allowed_roots: tuple[Path, ...],
    *,
    allow_installed_modules: bool = False,
    resources: Mapping[str, float] | None = None,
    environment: Mapping[str, str] | None = None,
) -> None:
    """What a request may name on this machine, checked before anything is written.

    Args:
        request: the job asked for.
        allowed_roots: the folders its code may come from.
        allow_installed_modules: a script may be ``-m`` of any module, installed ones too.
        resources: the cluster's (``CPU``, ``GPU``), which its ranks must fit (None: not
            checked).
        environment: the environment a job's process gets, in which a module's name is
            resolved (None: this process's).

    Raises:
        RequestError: a script without ``cwd``; a ``cwd``, script or module that resolves
            outside the allowed roots (403); a workload that is none or whose arguments it
            does not take; ranks the cluster cannot hold.
    """
    environment = os.environ if environment is None else environment
    if request.script is not None or request.cwd is not None:
        if request.script is None:
            raise RequestError("cwd is for a script job: give script too")
        if request.cwd is None:
            raise RequestError("a script job needs cwd: the folder the script runs in")
        cwd = inside_roots(request.cwd, allowed_roots, "cwd")
        if request.script[0] == "-m":
            _check_script_module(
                request.script, cwd, allowed_roots, allow_installed_modules, environment
            )
        else:
            script = (cwd / request.script[0]).resolve()
            if not is_inside(script, (cwd, *allowed_roots)):
                raise RequestError(f"script {request.script[0]!r} is outside cwd", 403)
            if not script.is_file():
                raise RequestError(f"script {request.script[0]!r} does not exist in {cwd}")
    elif _user_module(request.workload) is not None:
        _check_user_workload(request.workload, allowed_roots, environment)
    else:
        _check_builtin_workload(request.workload, request.workload_args)
    if resources is not None:
        check_fits(request, resources)


def _check_script_module(
    script: list[str],
    cwd: Path,
    allowed_roots: tuple[Path, ...],
    allow_installed: bool,
    environment: Mapping[str, str],
) -> None:
    """``-m MODULE``: a module name, which (unless installed ones are allowed) resolves in
    the script's folder's import path to files inside the allowed roots."""
    module = script[1] if len(script) > 1 else ""
    if not _MODULE.fullmatch(module):
        raise RequestError(f"script -m {module!r}: expected a module name (package.module)")
    if allow_installed:
        return
    problem = import_problem_for_job(
        module, cwd=cwd, roots=allowed_roots, environment=environment, first=True
    )
    if problem is not None:
        raise RequestError(
            f"script -m {module}: {problem} (a service started with "
            "--allow-installed-modules runs installed modules)",
            403,
        )


def _check_user_workload(
    workload: str, allowed_roots: tuple[Path, ...], environment: Mapping[str, str]
) -> None:
    """A user workload is imported in every rank: only from a folder the service allows,
    never a module installed on the cluster (such as os or subprocess), nor one a root's
    folder of the same name would only seem to be."""
    if not allowed_roots:
        raise RequestError(
            f"workload {workload!r}: this service runs built-in workloads only (start it "
            "with --allow-root DIR to allow workloads from DIR)",
            403,
        )
    module = workload.partition(":")[0]
    root = user_workload_root(workload, allowed_roots)
    if root is None:
        raise RequestError(
            f"workload {workload!r}: module {module.split('.')[0]!r} is in none of the "
            f"allowed roots ({', '.join(str(r) for r in allowed_roots)})",
            403,
        )
    problem = import_problem_for_job(
        module, cwd=root, roots=allowed_roots, environment=environment, first=False
    )
    if problem is not None:
        raise RequestError(f"workload {workload!r}: {problem}", 403)


def _check_builtin_workload(workload: str, workload_args: Mapping[str, ArgValue]) -> None:
    """A built-in name or ``hf:<model_type>`` (code installed with autotune and
    ``transformers``), with arguments it takes, of its types."""
    from autotune.workloads import WorkloadError
    from autotune.workloads.hf import HF_PREFIX
    from autotune.workloads.registry import check_arguments, find_factory

    expected = "expected a built-in name, hf:<model_type>, or package.module:function"
    if workload.startswith(HF_PREFIX):
        model_type = workload.removeprefix(HF_PREFIX)
        if not _HF_MODEL_TYPE.fullmatch(model_type):
            raise RequestError(f"workload {workload!r}: {expected}")
        known = hf_model_types()
        if known is not None and model_type not in known:
            raise RequestError(
                f"workload {workload!r}: transformers has no model type {model_type!r}"
                + did_you_mean(model_type, known)
            )
        implementation = workload_args.get("attn_implementation")
        if isinstance(implementation, str) and "/" in implementation:
            raise RequestError(
                f"workload {workload!r}: attn_implementation {implementation!r} names a Hub "
                "repository, whose kernels this service does not download"
            )
    elif ":" in workload or not _BUILTIN.fullmatch(workload):
        raise RequestError(f"workload {workload!r}: {expected}")
    try:
        check_arguments(workload, find_factory(workload), workload_args)
    except WorkloadError as err:
        raise RequestError(str(err)) from None


@lru_cache(maxsize=1)
def hf_model_types() -> frozenset[str] | None:
    """The model types ``transformers`` builds (None: it is not installed here)."""
    try:
        from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES
    except ImportError:
        return None
    return frozenset(CONFIG_MAPPING_NAMES)


def check_fits(request: JobRequest, resources: Mapping[str, float]) -> None:
    """The job's ranks fit the cluster: ``world_size`` × CPUs (and GPUs) per rank at most
    what it has, else no experiment could ever be placed.

    Raises:
        RequestError: they do not.
    """
    world_size = request.world_size or DEFAULT_WORLD_SIZE
    cpus = world_size * request.cpus_per_rank
    have_cpus = resources.get("CPU", 0.0)
    if cpus > have_cpus:
        raise RequestError(
            f"world_size {world_size} × cpus_per_rank {request.cpus_per_rank} needs "
            f"{cpus} CPUs: the cluster has {have_cpus:g}"
        )
    have_gpus = resources.get("GPU", 0.0)
    per_rank = request.gpus_per_rank
    if per_rank is None:  # as the runner decides: one each where the cluster has GPUs
        per_rank = 1.0 if have_gpus >= 1 else 0.0
    if world_size * per_rank > have_gpus:
        raise RequestError(
            f"world_size {world_size} × gpus_per_rank {per_rank:g} needs "
            f"{world_size * per_rank:g} GPUs: the cluster has {have_gpus:g}"
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
    if not is_inside(resolved, allowed_roots):
        raise RequestError(f"{what} {path!r} is outside the allowed roots", 403)
    if not resolved.is_dir():
        raise RequestError(f"{what} {path!r} is not a folder")
    return resolved


def user_workload_root(workload: str, allowed_roots: tuple[Path, ...]) -> Path | None:
    """The allowed root a user workload's module is imported from (None: a built-in)."""
    module = _user_module(workload)
    if module is None:
        return None
    top = module.split(".")[0]
    for root in allowed_roots:
        if (root / top).is_dir() or (root / f"{top}.py").is_file():
            return root
    return None


def _user_module(workload: str) -> str | None:
    """The module of a ``package.module:function`` workload (None: a built-in or hf: one)."""
    user = _USER_WORKLOAD.fullmatch(workload)
    return user["module"] if user is not None and not workload.startswith("hf:") else None


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", text).strip("-.")[:40] or "job"


def tuning_job(
    request: JobRequest,
    results_dir: Path,
    storage: str,
    allowed_roots: tuple[Path, ...] = (),
) -> TuningJob:
    """The :class:`~autotune.job.TuningJob` ``autotune run`` would assemble for ``request``
    (its config loaded and checked, nothing run), with the service's results directory and
    storage: what :func:`autotune.service.knowledge.job_key` keys. A user workload's package
    is looked for in the allowed root it is imported from (the job's process runs there).

    Raises:
        ConfigError, ScriptError: as :func:`autotune.api.load_job`.
    """
    from autotune.api import RunRequest, load_job

    options = RunOptions(
        **request.model_dump(include=set(TuningOptions.model_fields)),
        config=request.config,
        results_dir=str(results_dir),
        storage=storage,
    )
    workload_dir = user_workload_root(request.workload, allowed_roots)
    return load_job(RunRequest(options=options, names=_FIELD_NAMES, workload_dir=workload_dir))


def placement(request: JobRequest) -> dict[str, Any]:
    """What a job's ranks hold, which changes what is measured (part of its key)."""
    return {"cpus_per_rank": request.cpus_per_rank, "gpus_per_rank": request.gpus_per_rank}


# How an error names a request's field: by its JSON name.
_FIELD_NAMES = TuningOptions.autotuning_fields() | {
    "device_memory": "device_memory",
    "config": "config",
}
