"""A rank's host allocator is held steady, so that no experiment's steps page-fault their
activations anew by how much depends on what its process ran before (see
:func:`autotune.runner.rank.steady_allocator`). Each case runs in a fresh interpreter: the
allocator's state is the process's."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from autotune.runner.rank import STEADY_ALLOCATOR_ENV

# Prints how many fresh mappings one 24 MiB block took after running ``setup`` (glibc's default:
# 1, above its threshold, which starts at 128 KiB and rises only to the largest block freed,
# less than that in a tiny experiment; steady: 0, from the heap).
PROBE = """
import ctypes
FIELDS = "arena ordblks smblks hblks hblkhd usmblks fsmblks uordblks fordblks keepcost"
class Info(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in FIELDS.split()]
libc = ctypes.CDLL("libc.so.6")
libc.mallinfo2.restype = Info
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]
{setup}
before = libc.mallinfo2().hblks
block = libc.malloc(24 << 20)
print(libc.mallinfo2().hblks - before)
libc.free(block)
"""

STEADY = "from autotune.runner.rank import steady_allocator; steady_allocator()"


def fresh_mappings(setup: str, **env: str) -> int:
    code = PROBE.format(setup=textwrap.dedent(setup))
    done = subprocess.run(
        [sys.executable, "-c", code],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=120,
    )
    if "mallinfo2" in done.stderr or "libc.so.6" in done.stderr:
        pytest.skip("needs glibc 2.33 or newer")
    assert done.returncode == 0, done.stderr
    return int(done.stdout.split()[-1])


@pytest.mark.multirank
def test_a_rank_takes_a_large_block_from_the_heap(tmp_path: Path) -> None:
    # Through run_rank itself: a one-rank experiment of the tiny gpt, then the probe.
    setup = f"""
    from autotune.runner.rank import run_rank
    from tests.runner.specs import spec
    one_rank = {{"train_batch_size": 2, "train_micro_batch_size_per_gpu": 2,
                "optimizer": {{"type": "AdamW", "params": {{"lr": 1e-3}}}}}}
    experiment = spec("steady", world_size=1, ds_config=one_rank)
    outcome = run_rank(experiment, 0, "file://{tmp_path / "init"}")
    assert outcome.status.value == "ok", outcome.error_detail
    """
    assert fresh_mappings(setup) == 0


def test_the_users_malloc_setting_stands() -> None:
    assert fresh_mappings(STEADY, MALLOC_MMAP_THRESHOLD_="65536") == 1


def test_the_steady_allocator_can_be_turned_off() -> None:
    assert fresh_mappings(STEADY, **{STEADY_ALLOCATOR_ENV: "0"}) == 1
    assert fresh_mappings(STEADY) == 0
