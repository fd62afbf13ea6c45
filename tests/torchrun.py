"""A training script launched by torchrun, as a user launches one, its output captured."""

from __future__ import annotations

import os
import socket
import subprocess
import sys


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def torchrun(
    *script_args: str, nproc: int = 2, timeout_s: float = 180
) -> subprocess.CompletedProcess[str]:
    """``torchrun --nproc_per_node NPROC SCRIPT ARGS`` on 127.0.0.1, one thread per rank."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    for _attempt in range(3):
        command = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nproc_per_node",
            str(nproc),
            "--master_addr",
            "127.0.0.1",
            "--master_port",
            str(free_port()),
            *script_args,
        ]
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=timeout_s)
        # The free port can be taken by another process before torchrun binds it.
        if "address already in use" not in (done.stdout + done.stderr).lower():
            break
    return done
