"""What finished jobs taught, and how the next job uses it.

Every job that finishes by running records what it learned in its own study's user attributes
(:data:`KNOWLEDGE_ATTR`): the job's key, the hardware, its answer and the cost model it
fitted. The study lives in the service's Optuna storage, so a team's database shares this
between services, and nothing else holds it.

- **The same job** (same :func:`job_key`: the model's fingerprint, the config, the hardware,
  the world size, the engine, the software versions) is answered from the record at once.
- **A new job** on the same hardware starts from a :class:`~autotune.tuner.warm_start.WarmStart`
  (:func:`warm_start`): the constants fitted there last (the hardware's profile, which
  ``autotune plan --hardware FILE`` also reads) and the nearest earlier answers first, nearest
  by model size and world size.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

from autotune.results.files import atomic_write_json
from autotune.tuner.warm_start import WarmStart

if TYPE_CHECKING:
    import optuna

    from autotune.job import TuningJob

KNOWLEDGE_ATTR = "autotune_service"
# Earlier answers a new job measures first: each costs an experiment, so only the nearest.
MAX_ANSWERS = 3
# The autotuning keys that say where a job's results go, not what it tunes.
_WHERE_KEYS = ("results_dir", "storage", "overwrite")


@dataclass(frozen=True)
class HardwareId:
    """What the ranks run on, as the service tells hardware apart.

    Attributes:
        id: a file-safe name (``nvidia-h100-80gb-hbm3``, ``cpu-amd-epyc-7b13``).
        device: the device as the machine names it.
        catalog: the datasheet entry the cost model starts from (``h100-80gb``, ``cpu``).
    """

    id: str
    device: str
    catalog: str


@lru_cache(maxsize=1)
def this_hardware() -> HardwareId:
    """The hardware of this machine's ranks: its GPU, else its CPU model (a CPU's constants
    hold for that CPU only)."""
    import torch

    from autotune.tuner.hardware import hardware_for_device

    if torch.cuda.is_available():
        device = torch.cuda.get_device_name()
        catalog = hardware_for_device(device).name
    else:
        device = f"cpu {_cpu_model()}"
        catalog = hardware_for_device(None).name
    return HardwareId(_slug(device), device, catalog)


def job_key(job: TuningJob, hardware: str, placement: Mapping[str, Any]) -> str:
    """What makes two jobs the same, as a hash: the job's fingerprint (the model or script,
    the config, the world size, the memory budget, the profile window, the engine, the
    software versions), its ``autotuning`` section less where results go, the hardware and
    ``placement`` (CPUs and GPUs per rank: they change what is measured)."""
    fingerprint = job.fingerprint()
    autotuning = {k: v for k, v in fingerprint["autotuning"].items() if k not in _WHERE_KEYS}
    payload = {
        "tuned": fingerprint["tuned"],
        "autotuning": autotuning,
        "versions": fingerprint["versions"],
        "hardware": hardware,
        "placement": dict(placement),
    }
    text = json.dumps(payload, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def model_size(job: TuningJob) -> int | None:
    """The workload's parameters, counted on the meta device (nothing allocated); None for a
    script (its size is known once an experiment measured it) or a model that will not
    build there."""
    if job.script is not None:
        return None
    import torch

    from autotune.workloads import resolve_workload

    try:
        with torch.device("meta"):
            built = resolve_workload(job.workload, job.workload_args)
        return int(sum(p.numel() for p in built.model.parameters()))
    except Exception:  # the job's own check reports a workload that does not build
        return None


# --- the record ---------------------------------------------------------------------------------


def record(study: optuna.Study, entry: Mapping[str, Any]) -> None:
    """Keep what a finished job learned with its study (see the module docstring)."""
    study.set_user_attr(KNOWLEDGE_ATTR, dict(entry))


def entries(storage: optuna.storages.BaseStorage) -> list[dict[str, Any]]:
    """Every finished job's record in ``storage``, newest first, each with its ``study``."""
    found = []
    for study in storage.get_all_studies():
        entry = study.user_attrs.get(KNOWLEDGE_ATTR)
        if isinstance(entry, dict) and entry.get("key"):
            found.append({**entry, "study": study.study_name})
    found.sort(key=lambda e: str(e.get("finished_at", "")), reverse=True)
    return found


def answer_for(storage: optuna.storages.BaseStorage, key: str) -> dict[str, Any] | None:
    """The latest record of a job with ``key`` that found an answer, or None."""
    return next((e for e in entries(storage) if e["key"] == key and e.get("best")), None)


def warm_start(
    known: Iterable[Mapping[str, Any]],
    hardware: str,
    engine: str,
    num_params: int | None,
    world_size: int,
) -> tuple[WarmStart | None, dict[str, Any]]:
    """What earlier jobs on ``hardware`` (measured on ``engine``) teach a new one, and where
    it comes from, for the job's record: the constants the latest of them fitted, and the
    answers of the :data:`MAX_ANSWERS` nearest (by model size, then world size; ties: the
    newest), distinct. (None, {}) where none ran there."""
    same = [e for e in known if e.get("hardware") == hardware and e.get("engine") == engine]
    if not same:
        return None, {}
    fitted = next((e for e in same if e.get("cost_model")), None)

    def distance(entry: Mapping[str, Any]) -> float:
        size = entry.get("num_params")
        by_size = abs(math.log(size / num_params)) if size and num_params else 10.0
        return by_size + abs(math.log(max(1, int(entry.get("world_size") or 1)) / world_size))

    answers: list[dict[str, Any]] = []
    sources = []
    for entry in sorted(same, key=distance):  # sorted() is stable: newest first among ties
        overrides = entry.get("best_overrides")
        if overrides and overrides not in answers:
            answers.append(dict(overrides))
            sources.append(entry["job"])
        if len(answers) == MAX_ANSWERS:
            break
    warm = WarmStart(
        cost_model=fitted["cost_model"] if fitted is not None else None, answers=tuple(answers)
    )
    said = {
        "cost_model_from": fitted["job"] if fitted is not None else None,
        "answers_from": sources,
        "answers": answers,
    }
    return warm, said


# --- the hardware's profile ---------------------------------------------------------------------


def profile_path(profiles_dir: Path, hardware: str) -> Path:
    return profiles_dir / f"{hardware}.json"


def write_profile(
    profiles_dir: Path,
    hardware: HardwareId,
    cost_model: Mapping[str, Any],
    memory_bytes: int | None,
    job_id: str,
    finished_at: str,
) -> Path:
    """The latest constants fitted on ``hardware``, as ``autotune plan --hardware FILE``
    reads them: the datasheet's fields (its memory the job's budget, where it had one: a CPU
    rank's stands in for a GPU's), and the fitted cost model."""
    from autotune.tuner.hardware import CATALOG, CPU_RANK

    sheet = CATALOG.get(hardware.catalog, CPU_RANK).to_dict()
    if memory_bytes:
        sheet["memory_bytes"] = int(memory_bytes)
    sheet["name"] = hardware.id
    path = profile_path(profiles_dir, hardware.id)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_json(
        path,
        {
            "hardware": sheet,
            "cost_model": dict(cost_model),
            "device": hardware.device,
            "fitted_by_job": job_id,
            "fitted_at": finished_at,
        },
    )
    return path


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    import platform

    return platform.processor() or platform.machine()


def _slug(text: str) -> str:
    """``NVIDIA H100 80GB HBM3`` → ``nvidia-h100-80gb-hbm3``."""
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")[:80] or "unknown"
