"""``autotune serve`` as a separate process, for the tests that run jobs, kill it and look at
its page: start it, call its API, wait for a job, kill it."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from autotune.runner import free_port

# Jobs small enough for 2 shared cores: the MLP on one rank (each experiment a fresh process:
# torch's import is most of its time), two experiments.
SMALL_JOB = {"workload": "mlp", "num_trials": 2, "world_size": 1}
JOB_TIMEOUT_S = 240.0


class Served:
    """One ``autotune serve`` process on a free port, its output in ``state_dir/serve.log``."""

    def __init__(self, state_dir: Path, *args: str, env: dict[str, str] | None = None) -> None:
        self.state_dir = state_dir
        self.args = args
        self.env = env or {}
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> Served:
        self.state_dir.mkdir(parents=True, exist_ok=True)
        log = (self.state_dir / "serve.log").open("ab")
        environment = {**os.environ, "OMP_NUM_THREADS": "1", **self.env}
        self.process = subprocess.Popen(
            [
                *(sys.executable, "-m", "autotune", "serve", "--port", str(self.port)),
                *("--state-dir", str(self.state_dir), *self.args),
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=environment,
        )
        log.close()
        deadline = time.monotonic() + 120
        while True:
            try:
                self.call("GET", "/api/health")
                return self
            except OSError:
                if self.process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"autotune serve did not start: {self.log()}") from None
                time.sleep(0.3)

    def log(self) -> str:
        return (self.state_dir / "serve.log").read_text(errors="replace")[-3000:]

    def call(
        self, method: str, path: str, body: Any = None, token: str | None = None
    ) -> tuple[int, Any]:
        headers = {"Content-Type": "application/json"}
        if token:
            headers["Authorization"] = f"Bearer {token}"
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(self.url + path, data, headers, method=method)
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                return response.status, json.loads(response.read())
        except urllib.error.HTTPError as err:
            return err.code, json.loads(err.read() or b"null")

    def submit(self, body: dict[str, Any]) -> dict[str, Any]:
        status, answer = self.call("POST", "/api/jobs", body)
        assert status == 201, answer
        return dict(answer)

    def job(self, job_id: str) -> dict[str, Any]:
        return dict(self.call("GET", f"/api/jobs/{job_id}")[1])

    def wait(
        self, job_id: str, until: Any = None, timeout_s: float = JOB_TIMEOUT_S
    ) -> dict[str, Any]:
        """The job's view once ``until(view)`` holds (default: it ended)."""
        until = until or (lambda view: view["status"] in ("succeeded", "failed", "cancelled"))
        deadline = time.monotonic() + timeout_s
        while True:
            view = self.job(job_id)
            if until(view):
                return view
            if time.monotonic() > deadline:
                raise AssertionError(f"job {job_id} stuck at {view}; service log: {self.log()}")
            time.sleep(0.5)

    def kill(self) -> None:
        """``kill -9``: nothing of the service's runs after it."""
        assert self.process is not None
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(timeout=30)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
            try:
                self.process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def chromium() -> str | None:
    """Debian's headless Chromium (package chromium-headless-shell), or AUTOTUNE_CHROMIUM."""
    for candidate in (
        os.environ.get("AUTOTUNE_CHROMIUM"),
        "/usr/lib/chromium/chromium-headless-shell",
        shutil.which("chromium-headless-shell"),
    ):
        if candidate and Path(candidate).is_file():
            return candidate
    return None
