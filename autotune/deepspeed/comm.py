"""``deepspeed.comm``'s helpers that training scripts call: ranks, barriers, collectives.

A thin layer over ``torch.distributed``. The rank and size questions also answer without a
process group (rank 0 of a world of one, or what torchrun's environment says), as a script
asks them before ``init_distributed`` too.

Example:
    >>> import autotune as deepspeed
    >>> if deepspeed.comm.get_rank() == 0: print("only once")
    only once
"""

from __future__ import annotations

import os
from typing import Any

import torch.distributed as dist
from torch.distributed import ReduceOp

from autotune.engine.launch import init_distributed
from autotune.lazy import lazy_getattr


def is_initialized() -> bool:
    return dist.is_available() and dist.is_initialized()


def get_rank(group: Any = None) -> int:
    if is_initialized():
        return dist.get_rank(group)
    return int(os.environ.get("RANK", "0"))


def get_world_size(group: Any = None) -> int:
    if is_initialized():
        return dist.get_world_size(group)
    return int(os.environ.get("WORLD_SIZE", "1"))


def get_local_rank() -> int:
    return int(os.environ.get("LOCAL_RANK", "0"))


def barrier(group: Any = None) -> None:
    """Wait for every rank; a no-op without a process group."""
    if is_initialized():
        dist.barrier(group=group)


def all_reduce(
    tensor: Any, op: Any = ReduceOp.SUM, group: Any = None, async_op: bool = False
) -> Any:
    if not is_initialized():
        return None
    return dist.all_reduce(tensor, op=op, group=group, async_op=async_op)


def broadcast(tensor: Any, src: int, group: Any = None, async_op: bool = False) -> Any:
    if not is_initialized():
        return None
    return dist.broadcast(tensor, src=src, group=group, async_op=async_op)


def all_gather(
    tensor_list: list[Any], tensor: Any, group: Any = None, async_op: bool = False
) -> Any:
    if not is_initialized():
        tensor_list[0].copy_(tensor)
        return None
    return dist.all_gather(tensor_list, tensor, group=group, async_op=async_op)


def destroy_process_group(group: Any = None) -> None:
    if is_initialized():
        dist.destroy_process_group(group)


__getattr__ = lazy_getattr(__name__, {}, not_served="DeepSpeed")

__all__ = [
    "ReduceOp",
    "all_gather",
    "all_reduce",
    "barrier",
    "broadcast",
    "destroy_process_group",
    "get_local_rank",
    "get_rank",
    "get_world_size",
    "init_distributed",
    "is_initialized",
]
