"""Experiments measured on the installed DeepSpeed (``autotuning.engine: deepspeed``).

A config is tuned for the engine that measured it: DeepSpeed's costs (its fixed per-step work
at stages 1-3, its buckets, its CPU shared-memory all-reduce) are not the built-in engine's.
With this engine a rank builds DeepSpeed's own engine with ``deepspeed.initialize`` and times
it exactly as the built-in one (end to end, a barrier after each optimizer step; not
DeepSpeed's internal timers).

DeepSpeed keeps process state that outlives an engine: its comm backend and process groups
(Python globals), its accelerator, and on CPU a shared-memory all-reduce in a C++ extension.
Until resetting it between experiments is proven safe, every DeepSpeed experiment gets fresh
rank processes (:data:`autotune.engines.FRESH_PROCESSES`); what that costs is a rank's
start-up, which the result's ``startup_s`` shows. (A first reset under torchrun, which reuses
one rendezvous store, hung; with a fresh ``tcp://`` rendezvous per experiment, as the runners
make, resetting ``deepspeed.comm.comm`` and ``deepspeed.utils.groups`` ran stages 0-3 in the
same processes: the next step.)
"""

from __future__ import annotations

import contextlib
import glob
import json
import os
import time
from collections.abc import Iterator, Mapping
from typing import Any

from autotune.engine.hooks import EngineObserver
from autotune.engines import installed_deepspeed
from autotune.runner.rank import proc_status


def load(world_size: int) -> Any:
    """Import the installed DeepSpeed for a rank of ``world_size`` ranks on this node.

    Without a GPU DeepSpeed must be told to use its CPU accelerator, and that accelerator
    counts the node's devices from ``LOCAL_SIZE``; both are read at import.
    """
    import torch

    installed_deepspeed()
    clear_stale_build_locks()
    if not torch.cuda.is_available():
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
        os.environ.setdefault("LOCAL_SIZE", str(world_size))
    import deepspeed

    return deepspeed


def initialize(model: Any, config: Mapping[str, Any], world_size: int) -> Any:
    """DeepSpeed's engine for ``model`` under ``config``, in the process group this rank has
    already joined (DeepSpeed wraps it instead of making its own)."""
    import torch.distributed

    deepspeed = load(world_size)
    engine, _, _, _ = deepspeed.initialize(
        model=model,
        model_parameters=[p for p in model.parameters() if p.requires_grad],
        config=dict(config),
        dist_init_required=False,
    )
    torch.distributed.barrier()  # every rank has mapped its peers' all-reduce buffers
    release_shared_buffer(engine.global_rank)
    reset_peak_memory(engine.device)
    return engine


def reset_peak_memory(device: Any) -> None:
    """Start measuring the peak from here: the accelerator's counter on CUDA, the process's
    resident-set high-water mark on CPU (``/proc/self/clear_refs``)."""
    import torch

    if torch.device(device).type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        return
    try:
        with open("/proc/self/clear_refs", "w") as refs:
            refs.write("5")
    except OSError:  # not Linux: the peak then covers the process's life
        pass


def peak_memory_bytes(device: Any) -> int:
    """The most memory this rank held since :func:`reset_peak_memory`: allocated on CUDA, the
    process's peak resident set on CPU (which DeepSpeed's CPU accelerator only samples)."""
    import torch

    if torch.device(device).type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    peak_kib = proc_status().get("VmHWM")
    if peak_kib is None:  # not Linux: the process's lifetime peak
        import resource

        peak_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak_kib) * 1024


def resident_bytes() -> int:
    """This process's resident set now (what a CPU rank holds; 0 where unknown)."""
    return proc_status().get("VmRSS", 0) * 1024


@contextlib.contextmanager
def observing(observer: EngineObserver, world_size: int) -> Iterator[None]:
    """Script mode on DeepSpeed: for the block, ``deepspeed.initialize`` builds the experiment's
    engine and reports to ``observer`` as the built-in engine's hooks do.

    The script's config reaches the observer whichever way it is passed: a dict or a path as
    ``config`` / ``config_params`` (the HF clients pass the dict they filled), or the
    ``--deepspeed_config`` path, which the runner already pointed at the experiment's file.
    """
    deepspeed = load(world_size)
    original = deepspeed.initialize

    def initialize(*args: Any, **kwargs: Any) -> Any:
        for key in ("config", "config_params"):
            given = kwargs.get(key)
            if isinstance(given, str | os.PathLike):
                with open(given) as file:
                    given = json.load(file)
            if given is not None:
                kwargs[key] = observer.configure(dict(given))
        built = original(*args, **kwargs)
        _watch(built[0], observer)
        return built

    deepspeed.initialize = initialize
    try:
        yield
    finally:
        deepspeed.initialize = original


def _watch(engine: Any, observer: EngineObserver) -> None:
    """Report ``engine``'s forwards and optimizer steps (a step at an accumulation boundary
    advances ``global_steps``) to ``observer``."""
    step, forward = engine.step, engine.forward

    def observed_forward(*args: Any, **kwargs: Any) -> Any:
        observer.on_forward(engine, args, kwargs)
        return forward(*args, **kwargs)

    def observed_step(*args: Any, **kwargs: Any) -> Any:
        before = engine.global_steps
        out = step(*args, **kwargs)
        if engine.global_steps != before:
            if before == 0:  # every rank has joined a gradient reduction, so mapped the buffers
                release_shared_buffer(engine.global_rank)
            observer.on_optimizer_step(engine)
        return out

    engine.forward, engine.step = observed_forward, observed_step
    reset_peak_memory(engine.device)
    observer.on_engine(engine)


def release_shared_buffer(rank: int, host: str | None = None, port: str | None = None) -> None:
    """Unlink the name of ``rank``'s CPU all-reduce buffer in ``/dev/shm``.

    DeepSpeed's shared-memory all-reduce names a buffer per rank after the rendezvous
    (``MASTER_ADDR``, ``MASTER_PORT``, by default from the environment) and never unlinks it,
    so every experiment's (tens of MiB a rank) would stay in RAM until the machine restarts.
    Once every rank has mapped its peers' buffers (any collective that completed proves it)
    the name is no longer needed: the memory then goes with the last process that maps it,
    a killed one included. A name already gone, or never made (GPU, several nodes), is skipped.
    """
    host = host or os.environ.get("MASTER_ADDR")
    port = port or os.environ.get("MASTER_PORT")
    if not host or not port:
        return
    with contextlib.suppress(OSError):
        os.unlink(f"/dev/shm/deepspeed_allreduce_buffer_{os.getuid()}_{host}_{port}_{rank}")


# A live build holds its lock file open; a build that was killed leaves the file behind and
# every later load of that op waits on it forever.  Older than this and held by no process
# here, a lock is stale (the age guards a build on another node that shares the directory).
STALE_LOCK_AGE_S = 300.0


def clear_stale_build_locks() -> list[str]:
    """Remove the locks that interrupted builds of DeepSpeed's JIT ops left; returns them.

    torch's extension builder guards each op's build directory with a ``lock`` file that it
    creates, holds open while it builds, and removes after. Without this an experiment that
    needs the op (FusedAdam on CPU, the shared-memory all-reduce) would hang until its
    timeout, and so would every experiment after it.
    """
    from torch.utils.cpp_extension import get_default_build_root

    root = os.environ.get("TORCH_EXTENSIONS_DIR") or get_default_build_root()
    locks = glob.glob(os.path.join(root, "*", "lock")) + glob.glob(
        os.path.join(root, "*", "*", "lock")
    )
    now, removed = time.time(), []
    for lock in locks:
        with contextlib.suppress(OSError):
            if now - os.stat(lock).st_mtime > STALE_LOCK_AGE_S and not _held_open(lock):
                os.unlink(lock)
                removed.append(lock)
    return removed


def _held_open(path: str) -> bool:
    """Whether any process on this machine that we can see has ``path`` open."""
    target = os.path.realpath(path)
    for fds in glob.glob("/proc/[0-9]*/fd"):
        with contextlib.suppress(OSError):
            for fd in os.listdir(fds):
                with contextlib.suppress(OSError):
                    if os.readlink(os.path.join(fds, fd)) == target:
                        return True
    return False
