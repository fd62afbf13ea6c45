"""One rank's share of an experiment: a fresh process group, the workload, the profiled steps.

Both runners call :func:`run_rank` inside a rank process (a spawned process or a warm Ray
actor). It never raises: every failure comes back as a :class:`RankOutcome` with a status,
and a failing rank tears its process group down at once so peers blocked in a collective
fail fast instead of hanging.
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import importlib
import os
import time
from datetime import timedelta
from typing import Any

from autotune.config.keys import get_key
from autotune.config.knobs import CHECKPOINTING_KEY
from autotune.experiment import ExperimentSpec, Metrics, Status
from autotune.runner.measuring_engine import measuring_engine
from autotune.runner.outcome import RankOutcome, failure_outcome

# What a rank process imports before its first experiment, which would otherwise pay it
# (measured on 2 cores: 8-10 s of a fresh process's first experiment, 0.3 s of the next):
# torch, dynamo (torch.optim's first optimizer imports it), the FLOP counter, the script
# runner, and the modules that must be imported while no process group exists. Nothing
# here touches a device or starts a thread, so a process may fork after it.
_RANK_MODULES = (
    "torch",
    "torch._dynamo",
    "autotune.runner.rank",
    "autotune.runner.script",
    "autotune.profiling.flops",
)


def preload_rank_modules() -> None:
    """Import what a rank's first experiment would (see ``_RANK_MODULES``), here and now."""
    from autotune.engine.launch import import_before_process_groups

    for name in _RANK_MODULES:
        importlib.import_module(name)
    import_before_process_groups()


def set_rank_threads(num_threads: int) -> None:
    """One rank = ``num_threads`` cores; torch otherwise oversubscribes a shared machine."""
    import torch

    os.environ["OMP_NUM_THREADS"] = str(num_threads)
    torch.set_num_threads(num_threads)


def run_rank(spec: ExperimentSpec, rank: int, init_method: str) -> RankOutcome:
    """Run rank ``rank`` of ``spec`` in this process and report how it went.

    Args:
        spec: the experiment.
        rank: this process's rank in ``[0, spec.world_size)``.
        init_method: where ranks meet, e.g. ``tcp://127.0.0.1:29500``.
    """
    import torch.distributed as dist

    started = time.perf_counter()
    set_rank_threads(spec.cpus_per_rank)
    steady_allocator()
    outcome = RankOutcome(rank=rank, status=Status.ok)
    try:
        from autotune.engine.launch import import_before_process_groups

        import_before_process_groups()
        device = _device_for(rank)
        with measuring_engine(spec.engine).session(spec, rank, init_method, device):
            if spec.script is not None:
                from autotune.runner.script import run_script

                # The script makes its process group itself (env://), as under torchrun.
                outcome = run_script(spec, rank, init_method, device, started)
            else:
                dist.init_process_group(
                    backend="nccl" if device.type == "cuda" else "gloo",
                    init_method=init_method,
                    rank=rank,
                    world_size=spec.world_size,
                    timeout=timedelta(seconds=max(spec.timeout_s, 1.0)),
                )
                outcome = _profiled_run(spec, rank, init_method, device, started)
    except BaseException as exc:  # a failed experiment is data, never a crash
        outcome = failure_outcome(rank, exc)
        if isinstance(exc, KeyboardInterrupt):
            raise
    finally:
        _teardown(dist)
        release_memory()
    if outcome.status is Status.ok:
        measured_s = outcome.startup_s + outcome.warmup_s + outcome.window_s
        outcome.teardown_s = max(0.0, time.perf_counter() - started - measured_s)
    return outcome


def _device_for(rank: int) -> Any:
    import torch

    if torch.cuda.is_available():
        local = int(os.environ.get("LOCAL_RANK", rank)) % torch.cuda.device_count()
        torch.cuda.set_device(local)
        return torch.device("cuda", local)
    return torch.device("cpu")


def _profiled_run(
    spec: ExperimentSpec, rank: int, init_method: str, device: Any, started: float
) -> RankOutcome:
    import torch
    import torch.distributed as dist

    from autotune.profiling.flops import flops_per_micro_batch
    from autotune.profiling.interference import WindowCpu, sample_cpu
    from autotune.profiling.window import StepTimer, ends_early
    from autotune.workloads import resolve_workload

    assert spec.workload is not None  # a spec without a script has one
    workload = resolve_workload(spec.workload, dict(spec.workload_args), seed=spec.seed)
    config = spec.ds_config
    if get_key(config, CHECKPOINTING_KEY):
        # The model recomputes its activations: the workload does it, the engine cannot.
        if workload.activation_checkpointing is None:
            raise ValueError(
                f"{CHECKPOINTING_KEY} is set but workload {spec.workload!r} cannot switch "
                "activation checkpointing on"
            )
        workload.activation_checkpointing(True)
    model = workload.model.to(device)
    micro = int(config["train_micro_batch_size_per_gpu"])
    accumulation = int(config.get("gradient_accumulation_steps", 1))
    train_batch_size = int(config["train_batch_size"])

    flops_per_sample = spec.flops_per_sample
    if flops_per_sample is None:
        flops_per_sample = flops_per_micro_batch(workload, micro) / micro

    measuring = measuring_engine(spec.engine)
    engine = measuring.initialize(model, config, spec)
    generator = torch.Generator(device=device).manual_seed(spec.seed + 1000 * (rank + 1))

    def batches(num_steps: int) -> list[tuple[Any, ...]]:
        # Made before they are timed: synthetic data is not the input pipeline being tuned.
        return [workload.make_batch(micro, generator) for _ in range(num_steps * accumulation)]

    def train(micro_batches: list[tuple[Any, ...]]) -> None:
        """One optimizer step."""
        for inputs in micro_batches:
            loss = engine(*inputs)
            engine.backward(loss)
            engine.step()

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        dist.barrier()

    warmup_batches = batches(spec.start_profile_step - 1)
    window_batches = batches(spec.window_steps)
    sync()
    warmup_started = time.perf_counter()
    startup_s = warmup_started - started
    for first in range(0, len(warmup_batches), accumulation):
        train(warmup_batches[first : first + accumulation])
    timer = StepTimer(sync=sync)
    cpu_before = sample_cpu()
    timer.start()
    warmup_s = time.perf_counter() - warmup_started
    window_started = time.perf_counter()
    stopped_after_steps = None
    for timed in range(1, spec.window_steps + 1):
        train(window_batches[(timed - 1) * accumulation : timed * accumulation])
        timer.lap()
        if ends_early(timer, spec.window_steps, spec.stop_above_step_s):
            stopped_after_steps = timed
            break
    window_s = time.perf_counter() - window_started
    window_cpu = WindowCpu.between(cpu_before, sample_cpu())

    metrics = Metrics.from_window(
        timer.durations_s,
        train_batch_size=train_batch_size,
        flops_per_step=flops_per_sample * micro * accumulation,
        peak_memory_bytes=measuring.peak_memory_bytes(engine, device),
    )
    return RankOutcome(
        rank=rank,
        status=Status.ok,
        metrics=metrics.to_dict(),
        startup_s=startup_s,
        warmup_s=warmup_s,
        window_s=window_s,
        window_cpu=window_cpu.to_dict() if window_cpu is not None else None,
        stopped_after_steps=stopped_after_steps,
    )


def _teardown(dist: Any) -> None:
    """Destroy the process group; closing its sockets unblocks peers waiting on this rank."""
    if dist.is_initialized():
        # The group may already be broken by a peer; there is nothing left to save in it.
        with contextlib.suppress(Exception):
            dist.destroy_process_group()


# glibc's mallopt parameters (malloc.h) and the values steady_allocator sets: 32 MiB is the
# largest mmap threshold glibc accepts on 64-bit (where its own adaptive one stops), and the
# trim threshold is an int.
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
_STEADY_MALLOPT = {_M_TRIM_THRESHOLD: 2**31 - 1, _M_MMAP_THRESHOLD: 32 * 1024 * 1024}
# The environment variables that set the same parameters: what a user set there stands.
_MALLOPT_ENV = {
    _M_TRIM_THRESHOLD: "MALLOC_TRIM_THRESHOLD_",
    _M_MMAP_THRESHOLD: "MALLOC_MMAP_THRESHOLD_",
}
STEADY_ALLOCATOR_ENV = "AUTOTUNE_STEADY_ALLOCATOR"


def steady_allocator() -> bool:
    """Make the host allocator behave in every experiment as in a long training run.

    glibc serves a large block from a fresh mapping until a freed one teaches it otherwise
    (its mmap threshold adapts upwards), and gives memory back whenever the heap's free top
    grows. A short experiment's steps then page-fault their activations anew, by how much
    depending on what the process ran before: measured on 2 CPU cores, the first experiments
    of fresh rank processes ran up to 20% slower than later ones of the same config. Fixed
    thresholds (blocks up to 32 MiB from the heap, no trimming inside an experiment;
    :func:`release_memory` trims between experiments) make every experiment meet the same,
    steady allocator. ``AUTOTUNE_STEADY_ALLOCATOR=0`` leaves glibc's defaults; a
    ``MALLOC_*_`` variable the user set keeps its value. Returns whether anything was set
    (False off glibc).
    """
    if os.environ.get(STEADY_ALLOCATOR_ENV, "1") == "0":
        return False
    try:
        mallopt = ctypes.CDLL("libc.so.6").mallopt
    except (OSError, AttributeError):  # not glibc
        return False
    changed = False
    for param, value in _STEADY_MALLOPT.items():
        if _MALLOPT_ENV[param] not in os.environ:
            changed = bool(mallopt(param, value)) or changed
    return changed


def release_memory() -> None:
    """Give freed memory back (to the OS, and CUDA's cache to the device) so a warm process
    measures like a fresh one.

    Measured: warm actors grew from 305 to 1708 MiB RSS across six experiments without
    ``malloc_trim``; with it they stayed at 480-600 MiB.
    """
    import torch

    gc.collect()  # first: tensors held in reference cycles return their blocks to the cache
    if torch.cuda.is_initialized():
        # The caching allocator keeps a failed experiment's blocks reserved; the next one
        # would run in a fragmented pool (and nvidia-smi would show them held).
        torch.cuda.empty_cache()
    with contextlib.suppress(OSError, AttributeError):  # not glibc: nothing to trim
        ctypes.CDLL("libc.so.6").malloc_trim(0)
