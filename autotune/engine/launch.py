"""What a DeepSpeed training script calls before and around ``initialize``.

``add_config_arguments`` and ``init_distributed`` are DeepSpeed's; ``config_source`` applies
DeepSpeed's rule for where the config comes from (``config`` / ``config_params``, else
``args.deepspeed_config``); ``resolve_group`` is the group ``initialize`` trains over.

A default process group made here (by ``init_distributed``, or by ``initialize`` without
one) is destroyed when the script ends (:func:`destroy_created_group`, at exit): most
training scripts never destroy their group, and torch's gloo then tears a live group down
during interpreter shutdown, which aborts the process (``terminate called without an active
exception``) after a run that trained fine. A group the caller made stays theirs.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import functools
import importlib
import os
import time
import weakref
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from autotune.config import Config, ConfigError, read_json
from autotune.engine.collectives import local_cuda_device

ConfigSource = str | Path | dict[str, Any] | Config

# torch modules that bind the default process group as a default argument when first imported
# (``def broadcast(tensor, src, group=group.WORLD)``). Imported while a group exists, they hold
# it for the life of the process: destroy_process_group then closes none of its gloo
# connections (a peer blocked in a collective is never told this rank has failed), and the
# group is torn down during interpreter shutdown instead, where a gloo thread releasing its
# last work aborts the process. torch.optim's first optimizer imports the first of them
# (through torch._dynamo), so a group made before the engine's optimizer was always pinned.
_MODULES_BINDING_THE_DEFAULT_GROUP = (
    "torch.distributed.nn.functional",
    "torch.distributed.optim.zero_redundancy_optimizer",
    "torch.distributed.fsdp.sharded_grad_scaler",
)


def import_before_process_groups() -> None:
    """Import the torch modules that would pin a process group, while none exists (once per
    process; later calls cost a dictionary lookup each)."""
    if dist.is_available() and dist.is_initialized():
        return  # importing now would pin this group
    for name in _MODULES_BINDING_THE_DEFAULT_GROUP:
        with contextlib.suppress(ImportError):  # absent from this torch: nothing to pin
            importlib.import_module(name)


def add_config_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add DeepSpeed's ``--deepspeed`` and ``--deepspeed_config`` options to ``parser``.

    Example:
        >>> parser = add_config_arguments(argparse.ArgumentParser())
        >>> parser.parse_args(["--deepspeed_config", "ds.json"]).deepspeed_config
        'ds.json'
    """
    group = parser.add_argument_group("DeepSpeed", "DeepSpeed configurations")
    group.add_argument(
        "--deepspeed",
        default=False,
        action="store_true",
        help="Enable DeepSpeed (kept for scripts that check it; the engine is always on)",
    )
    group.add_argument(
        "--deepspeed_config", default=None, type=str, help="DeepSpeed json configuration file."
    )
    return parser


def config_source(
    args: Any, config: ConfigSource | None, config_params: ConfigSource | None
) -> ConfigSource | None:
    """The config ``initialize`` was given, by DeepSpeed's precedence; None if none was.

    ``config`` and ``config_params`` are the same argument under two names; either one wins
    over ``args.deepspeed_config``. Two different configs are an error, never a silent choice.
    """
    if config is not None and config_params is not None and not _same(config, config_params):
        raise ConfigError("", "initialize() got both config and config_params; pass one")
    explicit = config if config is not None else config_params
    from_args = getattr(args, "deepspeed_config", None) if args is not None else None
    if explicit is not None and from_args is not None and not _same(explicit, from_args):
        raise ConfigError(
            "",
            f"initialize() got a config and args.deepspeed_config={from_args!r} that differ; "
            "pass one (DeepSpeed refuses both as well)",
        )
    return explicit if explicit is not None else from_args


def script_config(args: Any, config: Any, config_params: Any) -> dict[str, Any] | None:
    """What a script passed as its config, as a dict, by the same precedence but without
    the two-sources check: in script mode the experiment's config replaces both anyway."""
    own = config if config is not None else config_params
    if own is None and args is not None:
        own = getattr(args, "deepspeed_config", None)
    if own is None:
        return None
    if isinstance(own, Config):
        return own.to_dict()
    if isinstance(own, str | Path):
        return read_json(own)
    return dict(own)


def _same(a: ConfigSource, b: ConfigSource) -> bool:
    if isinstance(a, str | Path) and isinstance(b, str | Path):
        return os.path.realpath(a) == os.path.realpath(b)
    return a is b or (isinstance(a, dict) and isinstance(b, dict) and a == b)


def init_distributed(
    dist_backend: str | None = None,
    auto_mpi_discovery: bool = True,
    distributed_port: int | None = None,
    verbose: bool = True,
    timeout: timedelta | None = None,
    init_method: str | None = None,
    dist_init_required: bool | None = None,
    config: Any = None,
    rank: int = -1,
    world_size: int = -1,
) -> None:
    """Create the default process group, as ``deepspeed.init_distributed`` does.

    Idempotent: an existing group is kept. Without ``init_method`` the group is made from
    torchrun's environment (``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``); a lone
    process with none of it becomes a world of one on ``127.0.0.1``. The backend defaults to
    nccl with CUDA, else gloo. ``auto_mpi_discovery``, ``verbose`` and ``config`` are accepted
    for compatibility and change nothing.
    """
    del auto_mpi_discovery, verbose, config
    if dist_init_required is False or dist.is_initialized():
        return
    backend = dist_backend or ("nccl" if torch.cuda.is_available() else "gloo")
    kwargs: dict[str, Any] = {}
    if timeout is not None:
        kwargs["timeout"] = timeout
    if rank >= 0 and world_size > 0:
        kwargs.update(rank=rank, world_size=world_size)
    elif "RANK" not in os.environ:  # a lone process, as DeepSpeed's single-process fallback
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(distributed_port or _free_port()))
        kwargs.update(rank=0, world_size=1)
    elif distributed_port is not None:
        os.environ.setdefault("MASTER_PORT", str(distributed_port))
    if backend == "nccl":
        local_cuda_device()  # before the group: NCCL binds to the current device
    import_before_process_groups()
    dist.init_process_group(backend, init_method=init_method or "env://", **kwargs)
    _remember_created_group()


def resolve_group(process_group: dist.ProcessGroup | None) -> dist.ProcessGroup | None:
    """The group to train over: the caller's, the default one, or one made from torchrun's env.

    Returns ``None`` for a single process with no launcher, which then trains alone without
    any collective.
    """
    if process_group is not None:
        return process_group
    if not dist.is_initialized() and int(os.environ.get("WORLD_SIZE", "1")) > 1:
        init_distributed()  # env:// reads RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT
    return dist.group.WORLD if dist.is_initialized() else None


# The default group this process made, weakly: a group destroyed and made again by someone
# else is not ours, and a strong reference would keep a destroyed group's sockets open.
_created_group: weakref.ref[dist.ProcessGroup] | None = None
# Seconds without the GIL before the group is destroyed at exit (see destroy_created_group).
EXIT_GRACE_S = 0.05


def _remember_created_group() -> None:
    global _created_group
    group = dist.group.WORLD
    if group is not None:
        _created_group = weakref.ref(group)
        _destroy_at_exit()


@functools.cache
def _destroy_at_exit() -> None:
    # Registered after torch's own exit handlers, so it runs before them (last in, first out).
    atexit.register(destroy_created_group)


def destroy_created_group() -> bool:
    """Destroy the default group this process made, if it is still the default one, after
    its pending GPU work; True if there was one. Called at exit."""
    group = _created_group() if _created_group is not None else None
    if group is None or not dist.is_initialized() or dist.group.WORLD is not group:
        return False
    if torch.cuda.is_initialized():
        torch.cuda.synchronize()
    # Destroying a gloo group joins its worker threads while holding the GIL, and a worker
    # still dropping the last collective's Python tensors needs the GIL to finish: a hang.
    # A moment without the GIL lets it finish first (seen under DDP's Reducer, 1 run in 10).
    time.sleep(EXIT_GRACE_S)
    dist.destroy_process_group()
    return True


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])
