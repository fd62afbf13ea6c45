"""A training script launched by torchrun, as a user launches one, its output captured."""

from __future__ import annotations

import os
import signal
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
    """``torchrun --nproc_per_node NPROC SCRIPT ARGS`` on 127.0.0.1, one thread per rank.

    Past ``timeout_s`` the launcher and its ranks are killed together (a rank outlives a
    killed launcher, and would hold its cores for the rest of the suite) and the test fails
    with what they printed."""
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
        done = _run_group(command, env, timeout_s)
        # The free port can be taken by another process before torchrun binds it.
        if "address already in use" not in (done.stdout + done.stderr).lower():
            break
    return done


def _run_group(
    command: list[str], env: dict[str, str], timeout_s: float
) -> subprocess.CompletedProcess[str]:
    with subprocess.Popen(
        command,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    ) as process:
        try:
            stdout, stderr = process.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            stdout, stderr = process.communicate()
            raise AssertionError(
                f"torchrun ran past {timeout_s:g} s and was killed with its ranks:\n"
                f"{stdout[-2000:]}\n{stderr[-4000:]}"
            ) from None
    return subprocess.CompletedProcess(command, process.returncode, stdout, stderr)
