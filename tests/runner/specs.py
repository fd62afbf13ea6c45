"""Experiment specs the runner tests share: a tiny gpt (or a faulty one) on two ranks, and
stand-ins whose ranks only sleep (``stand_in_rank`` runs in the rank actors, so it lives in a
module they can import)."""

from __future__ import annotations

import importlib
import json
import os
import time
from pathlib import Path
from typing import Any

from autotune.experiment import ExperimentSpec, Metrics, Status
from autotune.runner.outcome import RankOutcome
from autotune.runner.process import PortReservation, reserve_port
from autotune.script_target import ScriptTarget
from tests.runner.faulty_workloads import TINY_GPT
from tests.specs import job_spec

FAULTY = "tests.runner.faulty_workloads:faulty"
DS_SCRIPT = Path(__file__).with_name("ds_script.py")


def spec(
    name: str, workload: str = "gpt", args: dict[str, Any] | None = None, **kw: Any
) -> ExperimentSpec:
    ds_config = kw.pop(
        "ds_config",
        {
            "train_batch_size": 8,
            "train_micro_batch_size_per_gpu": 2,
            "gradient_accumulation_steps": 2,
            "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
            "zero_optimization": {"stage": 2},
        },
    )
    return job_spec(
        name,
        ds_config,
        workload=workload,
        workload_args=TINY_GPT if args is None else args,
        **{"start_profile_step": 2, "end_profile_step": 4, **kw},
    )


def script_spec(name: str, output_dir: Path, **kw: Any) -> ExperimentSpec:
    """``ds_script.py`` (a DeepSpeed-style script, its loader following the micro-batch) as
    :func:`spec`'s experiment: ZeRO-2, micro-batch 2, accumulation 2, window steps 2-4."""
    config = {
        "train_batch_size": 8,
        "train_micro_batch_size_per_gpu": 2,
        "gradient_accumulation_steps": 2,
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
        "zero_optimization": {"stage": 2},
    }
    target = ScriptTarget.from_command(
        [str(DS_SCRIPT), "--deepspeed", "ds_config.json"],
        {"train_micro_batch_size_per_gpu": "--per_device_train_batch_size"},
    )
    return spec(
        name,
        workload=None,
        args={},
        ds_config=config,
        script=target,
        client_config=config,
        output_dir=str(output_dir / name),
        **kw,
    )


# What a rank's process must hold before torch loads, as stand_in_rank reports it.
RANK_ENV = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "CUDA_VISIBLE_DEVICES")


def stand_in_rank(spec: ExperimentSpec, rank: int, init_method: str) -> RankOutcome:
    """Sleeps ``sleep_s`` and reports success; writes its pid to ``pid_dir`` and its
    :data:`RANK_ENV` (JSON) to ``env_dir`` if given, and with ``value_of`` (a module on the
    driver's import path) that module's ``VALUE`` as this process imports it, beside the pid
    (``NAME-RANK.value``)."""
    args = spec.workload_args
    if "pid_dir" in args:
        (Path(args["pid_dir"]) / f"{spec.name}-{rank}").write_text(str(os.getpid()))
    if "value_of" in args:
        value = importlib.import_module(str(args["value_of"])).VALUE
        (Path(args["pid_dir"]) / f"{spec.name}-{rank}.value").write_text(str(value))
    if "env_dir" in args:
        env = {name: os.environ.get(name) for name in RANK_ENV}
        (Path(args["env_dir"]) / f"{spec.name}-{rank}").write_text(json.dumps(env))
    started = time.perf_counter()
    time.sleep(float(args.get("sleep_s", 0.0)))
    window_s = time.perf_counter() - started
    metrics = Metrics.from_window([window_s], 1, 1.0, 0).to_dict()
    return RankOutcome(rank=rank, status=Status.ok, metrics=metrics, window_s=window_s)


def stand_in(
    name: str, world_size: int = 1, timeout_s: float = 60, **args: object
) -> ExperimentSpec:
    return job_spec(
        name,
        workload="stand-in",
        workload_args=args,
        world_size=world_size,
        end_profile_step=1,
        timeout_s=timeout_s,
    )


def taken_once(marker: str, host: str) -> PortReservation:
    """A rendezvous port that another process took first (the port number in the file
    ``marker``, which a test's socket listens on), the first time; then a real one. Runs
    where the runner reserves ports: the driver, or rank 0's actor."""
    path = Path(marker)
    if path.exists():
        port = int(path.read_text())
        path.unlink()
        return PortReservation(port)  # holds nothing: the other process has it
    return reserve_port(host)


def taken_always(port: int, host: str) -> PortReservation:
    """A rendezvous port another process always took first."""
    return PortReservation(port)
