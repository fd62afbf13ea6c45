"""Experiments measured on the installed DeepSpeed (``autotuning.engine: deepspeed``).

A config is tuned for the engine that measured it: DeepSpeed's costs (its fixed per-step work
at stages 1-3, its buckets, its CPU shared-memory all-reduce) are not the built-in engine's.
With this engine a rank builds DeepSpeed's own engine with ``deepspeed.initialize`` and times
it exactly as the built-in one (end to end, a barrier after each optimizer step; not
DeepSpeed's internal timers).

DeepSpeed keeps process state that outlives an engine, and the warm rank processes run one
experiment after another, so :func:`session` puts it back after each: its registry of
process groups (``deepspeed.utils.groups``, which names the experiment's destroyed groups)
returns to how import left it, and Accelerate's singletons are forgotten. Its comm backend
is kept: it follows torch's default group, which each experiment makes afresh, and its CPU
shared-memory all-reduce is set up once per process (a second backend would map another
64 MiB a rank). After a failed experiment the gang is replaced instead
(:attr:`autotune.runner.measuring_engine.MeasuringEngine.fresh_after_failure`): a failure can
leave anything half done.

Torch-free at import: the driver checks the installed DeepSpeed (:func:`installed_deepspeed`)
before anything starts, and importing DeepSpeed probes accelerators and takes seconds.
"""

from __future__ import annotations

import contextlib
import copy
import glob
import hashlib
import importlib.metadata
import importlib.util
import json
import os
import re
import shutil
import sysconfig
import time
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

from autotune.runner.process import entries_set, proc_status

if TYPE_CHECKING:  # the engine package imports torch; its hooks need none
    from autotune.engine.hooks import EngineObserver

# The oldest DeepSpeed whose ``initialize`` / engine API this runner calls as it does.
MIN_VERSION = (0, 14, 0)


class DeepSpeedUnavailable(RuntimeError):
    """``autotuning.engine`` is ``deepspeed`` but no usable DeepSpeed is installed."""


def installed_deepspeed() -> str:
    """The installed DeepSpeed's version, checked against :data:`MIN_VERSION`, without
    importing it (importing DeepSpeed probes accelerators and takes seconds).

    Raises:
        DeepSpeedUnavailable: none is installed, or it is older than :data:`MIN_VERSION`.
    """
    wanted = ".".join(map(str, MIN_VERSION))
    try:
        version = importlib.metadata.version("deepspeed")
    except importlib.metadata.PackageNotFoundError:
        raise DeepSpeedUnavailable(
            f"autotuning.engine is 'deepspeed' but DeepSpeed is not installed here: "
            f"pip install 'deepspeed>={wanted}' (or autotune's 'deepspeed' extra)"
        ) from None
    if "+autotune" in version:  # autotune's own stand-in, inside an experiment
        raise DeepSpeedUnavailable(
            "autotuning.engine is 'deepspeed' but 'deepspeed' is autotune's stand-in here"
        )
    numbers = tuple(int(n) for n in re.findall(r"\d+", version)[:3])
    if numbers < MIN_VERSION:
        raise DeepSpeedUnavailable(
            f"autotuning.engine is 'deepspeed' but DeepSpeed {version} is installed; autotune "
            f"drives DeepSpeed >= {wanted}"
        )
    return version


def load(world_size: int) -> Any:
    """Import the installed DeepSpeed for a rank of ``world_size`` ranks on this node.

    Without a GPU DeepSpeed must be told to use its CPU accelerator, and that accelerator
    counts the node's devices from ``LOCAL_SIZE``; both are read at import. The ops DeepSpeed
    compiles when first used are built in :func:`extensions_dir` (unless
    ``TORCH_EXTENSIONS_DIR`` is set), with the CPU's description asked once a boot
    (:func:`_remember_cpu_info`).
    """
    import torch

    installed_deepspeed()
    os.environ.setdefault(EXTENSIONS_ENV, extensions_dir())
    os.environ["PATH"] = environment_ninja_first(os.environ.get("PATH", ""))
    if _pristine_groups is None:  # the first load in this process
        clear_leftovers()
        _remember_cpu_info()
    if not torch.cuda.is_available():
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
        os.environ.setdefault("LOCAL_SIZE", str(world_size))
    import deepspeed

    _remember_pristine_groups()
    return deepspeed


def prepare(world_size: int) -> None:
    """Pay in advance, as a rank actor starts, what the first DeepSpeed experiment in a
    process would: the import, DeepSpeed's lazy imports (ZeRO's optimizer check imports Muon,
    which imports torch's compiler: 1.4-1.8 s), and on CPU the ops every experiment loads
    (the shared-memory all-reduce, and FusedAdam, DeepSpeed's Adam and AdamW), built here if
    they are not yet. Measured on 2 busy cores: 4-12 s that the first experiment of a new
    gang otherwise spent inside its timeout, minutes when an op had to be built.
    """
    import torch

    deepspeed = load(world_size)
    with contextlib.suppress(ImportError):  # not in every DeepSpeed version
        importlib.import_module("deepspeed.runtime.zero.muon.muon_optimizer")
    if torch.cuda.is_available():
        return  # CUDA ops are built (minutes) only for an experiment that needs them
    from deepspeed.accelerator import get_accelerator

    for op in ("ShareMemCommBuilder", "FusedAdamBuilder"):
        builder = get_accelerator().create_op_builder(op)
        if builder is not None and deepspeed.ops.__compatible_ops__.get(builder.NAME, False):
            builder.load()


# Where PyTorch builds the ops DeepSpeed compiles on first use (see extensions_dir).
EXTENSIONS_ENV = "TORCH_EXTENSIONS_DIR"


def environment_ninja_first(path: str, scripts: str | None = None) -> str:
    """``path`` (a ``PATH``) with this Python environment's scripts folder first when it holds
    a ``ninja`` that ``path`` would not find first: the ops are then built by the ninja
    DeepSpeed's install brought, as from an activated environment, whoever started the run.

    Ninja records each build's command by a hash that its versions compute differently (1.11
    and 1.13 disagree), so a system ninja and the environment's one each take the other's
    build for a changed command and rebuild every op: measured on 2 cores, a run started
    without the environment activated after one started with it spent 120 s in its first
    experiment's startup (6-9 s otherwise), and the next run with it activated 118 s again.
    """
    scripts = scripts if scripts is not None else sysconfig.get_path("scripts")
    ninja = os.path.join(scripts, "ninja")
    if not os.access(ninja, os.X_OK):
        return path
    found = shutil.which("ninja", path=path)
    if found is not None and os.path.realpath(found) == os.path.realpath(ninja):
        return path
    return os.pathsep.join([scripts, *(entry for entry in path.split(os.pathsep) if entry)])


def extensions_dir() -> str:
    """The folder DeepSpeed's JIT-built ops are built in and loaded from: PyTorch's default,
    where DeepSpeed run directly (its launcher, its own autotuner) builds them too, unless
    another installation's builds are there.

    PyTorch's default folder is one per Python and CUDA version, shared by every environment
    of the user; an op's build names the environment's include paths, so an op built by
    another environment's DeepSpeed is rebuilt (60-80 s each on 2 cores) while every rank
    that loads it waits on the build's lock, and rebuilt again when that environment loads
    it next. Measured with four environments on one machine: first experiments of 65-87 s,
    and one cut by its 90 s timeout. Where another installation built there, this one takes
    a folder of its own (:func:`own_extensions_dir`). Otherwise the default is shared: a
    folder of autotune's own made a fresh machine build every op twice, once for DeepSpeed
    run directly and once for autotune (the head-to-head with DeepSpeed's autotuner, cold).
    A folder of its own that already holds builds is kept while the default holds none.
    """
    import torch
    from torch.utils.cpp_extension import get_default_build_root

    shared = os.path.join(get_default_build_root(), _build_folder())
    own = own_extensions_dir()
    ours = (_deepspeed_dir(), os.path.dirname(torch.__file__))
    builders = [
        _built_by(path, ours) for path in glob.glob(os.path.join(shared, "*", "build.ninja"))
    ]
    if not all(builders):
        return own
    if not builders and glob.glob(os.path.join(own, "*", "build.ninja")):
        return own
    return shared


def own_extensions_dir() -> str:
    """This installation's own folder for DeepSpeed's ops, beside PyTorch's default: keyed by
    DeepSpeed's location and the torch, CUDA and Python versions, each installation builds
    its ops once."""
    import torch
    from torch.utils.cpp_extension import get_default_build_root

    key = hashlib.sha256(f"{_deepspeed_dir()}\0{torch.__version__}".encode()).hexdigest()[:12]
    return os.path.join(get_default_build_root(), f"{_build_folder()}_deepspeed_{key}")


def _build_folder() -> str:
    """PyTorch's folder for builds of this Python and CUDA version (``py311_cu124``,
    ``py311_cpu``), as ``torch.utils.cpp_extension`` names it under its default root."""
    import sys

    import torch

    python = f"py{sys.version_info.major}{sys.version_info.minor}{getattr(sys, 'abiflags', '')}"
    hip, cuda = getattr(torch.version, "hip", None), torch.version.cuda
    accelerator = (
        f"rocm{hip.replace('.', '')}" if hip else f"cu{cuda.replace('.', '')}" if cuda else "cpu"
    )
    return f"{python}_{accelerator}"


def _deepspeed_dir() -> str:
    spec = importlib.util.find_spec("deepspeed")
    return os.path.dirname(spec.origin) if spec is not None and spec.origin else ""


def _built_by(build_file: str, installation: tuple[str, ...]) -> bool:
    """Whether the op that ``build_file`` (its ``build.ninja``) builds was built by
    ``installation`` (DeepSpeed's and torch's folders): its commands name both."""
    try:
        with open(build_file) as build:
            text = build.read()
    except OSError:  # gone, or being written: nobody else's build to avoid
        return True
    return all(os.path.join(folder, "") in text for folder in installation if folder)


_cpu_info_remembered = False


def _remember_cpu_info() -> None:
    """Ask py-cpuinfo once a boot instead of twice per op load.

    DeepSpeed's op builders ask it for the CPU's flags each time they load an op (before
    PyTorch even checks whether the build is current), and it answers from a fresh Python
    subprocess: 1.4 s a call on 2 busy cores, twice in the first experiment of every rank
    process. The answer is the machine's until it reboots: kept in this process and in a file
    per node and boot, in :func:`extensions_dir`.
    """
    global _cpu_info_remembered
    try:
        import cpuinfo
    except ImportError:  # DeepSpeed then asks lscpu, which is quick
        return
    if _cpu_info_remembered:
        return
    _cpu_info_remembered = True
    ask = cpuinfo.get_cpu_info
    path = _cpu_info_path()
    known: dict[str, Any] = {}

    def get_cpu_info() -> dict[str, Any]:
        if not known:
            known.update(_read_json(path) if path else {})
        if not known:
            known.update(ask())
            if path:
                _write_json(path, known)
        return copy.deepcopy(known)

    cpuinfo.get_cpu_info = get_cpu_info


def _cpu_info_path() -> str | None:
    try:
        with open("/proc/sys/kernel/random/boot_id") as boot:
            boot_id = boot.read().strip()
    except OSError:  # not Linux: remembered in this process only
        return None
    folder = os.environ.get(EXTENSIONS_ENV) or extensions_dir()
    return os.path.join(folder, f"cpuinfo-{os.uname().nodename}-{boot_id}.json")


def _read_json(path: str) -> dict[str, Any]:
    try:
        with open(path) as file:
            data = json.load(file)
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _write_json(path: str, data: Mapping[str, Any]) -> None:
    with contextlib.suppress(OSError):  # a cache: without it the next process asks again
        os.makedirs(os.path.dirname(path), exist_ok=True)
        partial = f"{path}.{os.getpid()}.tmp"
        with open(partial, "w") as file:
            json.dump(data, file)
        os.replace(partial, path)


# ``deepspeed.utils.groups``' module state as import left it: what session restores.
_pristine_groups: dict[str, Any] | None = None
# The engines built in this process's current experiment: session destroys them.
_engines: list[Any] = []


@contextlib.contextmanager
def session(env: Mapping[str, str]) -> Iterator[None]:
    """One experiment on DeepSpeed in this process, and this process ready for the next.

    Inside, torchrun's variables ``env`` are set (DeepSpeed reads its rank and node from
    them). At the end every engine built inside is destroyed: ``destroy`` is how DeepSpeed
    lets an engine go (its optimizer's hooks, its debug names of every module and parameter,
    its hold on Python's GC); without it each experiment's model and optimizer stayed in the
    warm process (80 MiB an experiment for the default GPT on CPU) and later experiments
    measured slower. Then the rank's all-reduce buffer loses its name (if the experiment
    failed before its first step) and the process state is reset (see the module docstring).
    """
    with entries_set(os.environ, env):
        try:
            yield
        except BaseException:
            with contextlib.suppress(Exception):  # the experiment's own error is the verdict
                _destroy_engines()
            raise
        else:
            _destroy_engines()
        finally:
            release_shared_buffer(int(env["RANK"]))
            _reset_state()


def _destroy_engines() -> None:
    while _engines:
        _engines.pop().destroy()


def _remember_pristine_groups() -> None:
    global _pristine_groups
    if _pristine_groups is None:
        from deepspeed.utils import groups

        _pristine_groups = {
            name: copy.copy(value)
            for name, value in vars(groups).items()
            if not name.startswith("__")
            and (value is None or isinstance(value, dict | list | set | int | str))
        }


def _reset_state() -> None:
    from autotune.deepspeed.stand_in import reset_accelerate

    reset_accelerate()
    if _pristine_groups is None:  # DeepSpeed was never loaded here
        return
    from deepspeed.utils import groups

    for name, value in _pristine_groups.items():
        setattr(groups, name, copy.copy(value))


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
    _engines.append(engine)
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
        _engines.append(built[0])
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


# How DeepSpeed's CPU all-reduce names its buffers: ``<prefix>_<uid>_<addr>_<port>_<rank>``.
SHARED_BUFFER_PREFIX = "deepspeed_allreduce_buffer"


def release_shared_buffer(rank: int) -> None:
    """Unlink the name of ``rank``'s CPU all-reduce buffer in ``/dev/shm``.

    DeepSpeed's shared-memory all-reduce names a buffer per rank after the rendezvous
    (``MASTER_ADDR``, ``MASTER_PORT`` in the environment) and never unlinks it,
    so every experiment's (tens of MiB a rank) would stay in RAM until the machine restarts.
    Once every rank has mapped its peers' buffers (any collective that completed proves it)
    the name is no longer needed: the memory then goes with the last process that maps it,
    a killed one included. A name already gone, or never made (GPU, several nodes), is skipped.
    """
    host, port = os.environ.get("MASTER_ADDR"), os.environ.get("MASTER_PORT")
    if not host or not port:
        return
    with contextlib.suppress(OSError):
        os.unlink(f"/dev/shm/{SHARED_BUFFER_PREFIX}_{os.getuid()}_{host}_{port}_{rank}")


# What a killed DeepSpeed process leaves behind: a JIT op's build lock (a live build holds it
# open; left behind, every later load of that op waits on it forever) and its shared-memory
# all-reduce buffer (a live rank maps it; left behind, 64 MiB of RAM until the machine
# restarts). Older than this and used by no process here, either is stale; the age guards
# a build on another node that shares the directory, and a buffer being made.
STALE_AGE_S = 300.0


def clear_leftovers() -> list[str]:
    """Remove the stale leftovers of killed DeepSpeed processes (see :data:`STALE_AGE_S`);
    returns what was removed. Without it an experiment that needs the op would hang until
    its timeout, and so would every experiment after it."""
    from torch.utils.cpp_extension import get_default_build_root

    root = os.environ.get("TORCH_EXTENSIONS_DIR") or get_default_build_root()
    candidates = [
        *glob.glob(os.path.join(root, "*", "lock")),
        *glob.glob(os.path.join(root, "*", "*", "lock")),
        *glob.glob(f"/dev/shm/{SHARED_BUFFER_PREFIX}_{os.getuid()}_*"),
    ]
    now = time.time()
    old = []
    for path in candidates:
        with contextlib.suppress(OSError):
            if now - os.stat(path).st_mtime > STALE_AGE_S:
                old.append(os.path.realpath(path))
    in_use = _in_use(old) if old else set()
    removed = []
    for path in old:
        if path not in in_use:
            with contextlib.suppress(OSError):
                os.unlink(path)
                removed.append(path)
    return removed


def _in_use(paths: list[str]) -> set[str]:
    """Those of ``paths`` that a process on this machine (one we may inspect) has open or
    mapped."""
    wanted, found = set(paths), set()
    for proc in glob.glob("/proc/[0-9]*"):
        with contextlib.suppress(OSError):
            for fd in os.listdir(os.path.join(proc, "fd")):
                with contextlib.suppress(OSError):
                    target = os.readlink(os.path.join(proc, "fd", fd))
                    if target in wanted:
                        found.add(target)
        with contextlib.suppress(OSError), open(os.path.join(proc, "maps")) as maps:
            for line in maps:
                fields = line.rstrip("\n").split(maxsplit=5)
                if len(fields) == 6 and fields[5] in wanted:
                    found.add(fields[5])
    return found
