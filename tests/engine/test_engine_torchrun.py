"""A DeepSpeed-style training loop launched by torchrun on two processes."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).with_name("ds_train_loop.py")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.mark.multirank
@pytest.mark.parametrize("stage", [1, 3])
def test_torchrun_training_loop(stage: int) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    for _attempt in range(3):
        command = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nproc_per_node",
            "2",
            "--master_addr",
            "127.0.0.1",
            "--master_port",
            str(_free_port()),
            str(SCRIPT),
            str(stage),
        ]
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)
        # The free port can be taken by another process before torchrun binds it.
        if "address already in use" not in (done.stdout + done.stderr).lower():
            break
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.count(" ok: loss ") == 2
