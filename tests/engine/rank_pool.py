"""A pool of long-lived ranks (gloo, or NCCL on GPUs) that run test functions in one group.

Spawning ranks costs seconds (importing torch), so a test module starts the pool once and
sends it many small functions. A function that raises on some rank fails the test with that
rank's traceback; the pool stays usable as long as no rank is stuck in a collective.
"""

from __future__ import annotations

import os
import queue
import tempfile
import traceback
from collections.abc import Callable
from typing import Any

import torch.multiprocessing as mp

TIMEOUT_S = 120


def _serve(
    rank: int, world_size: int, backend: str, init_file: str, tasks: Any, results: Any
) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    for key in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "LOCAL_RANK"):
        os.environ.pop(key, None)
    if backend == "nccl":
        torch.cuda.set_device(rank)  # one GPU per rank, chosen before NCCL binds to one
    dist.init_process_group(
        backend, init_method=f"file://{init_file}", rank=rank, world_size=world_size
    )
    while True:
        task = tasks.get()
        if task is None:
            break
        fn, args, kwargs = task
        try:
            results.put((rank, True, fn(*args, **kwargs)))
        except BaseException as err:  # reported to the test, which fails
            results.put((rank, False, f"{type(err).__name__}: {err}\n{traceback.format_exc()}"))
    dist.destroy_process_group()


class RankPool:
    """``world_size`` processes in one group; ``run(fn)`` calls ``fn`` on each of them."""

    def __init__(self, world_size: int = 2, backend: str = "gloo") -> None:
        ctx = mp.get_context("spawn")
        self.world_size = world_size
        self._dir = tempfile.TemporaryDirectory()
        init_file = os.path.join(self._dir.name, "init")
        self._tasks = [ctx.Queue() for _ in range(world_size)]
        self._results = ctx.Queue()
        self._procs = [
            ctx.Process(
                target=_serve,
                args=(r, world_size, backend, init_file, self._tasks[r], self._results),
                daemon=True,
            )
            for r in range(world_size)
        ]
        for proc in self._procs:
            proc.start()

    def run_raw(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> list[tuple[bool, Any]]:
        """``(ok, value or traceback)`` from every rank, in rank order."""
        for tasks in self._tasks:
            tasks.put((fn, args, kwargs))
        out: dict[int, tuple[bool, Any]] = {}
        while len(out) < self.world_size:
            try:
                rank, ok, value = self._results.get(timeout=TIMEOUT_S)
            except queue.Empty:
                self.close(kill=True)
                raise TimeoutError(f"ranks {set(range(self.world_size)) - set(out)} hung") from None
            out[rank] = (ok, value)
        return [out[r] for r in range(self.world_size)]

    def run(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> list[Any]:
        """What ``fn`` returned on every rank; raises if it raised on any."""
        results = self.run_raw(fn, *args, **kwargs)
        failed = [f"rank {r}: {value}" for r, (ok, value) in enumerate(results) if not ok]
        if failed:
            raise AssertionError("\n".join(failed))
        return [value for _, value in results]

    def close(self, kill: bool = False) -> None:
        for proc, tasks in zip(self._procs, self._tasks, strict=True):
            if kill:
                proc.kill()
            elif proc.is_alive():
                tasks.put(None)
        for proc in self._procs:
            proc.join(timeout=10)
        self._dir.cleanup()
