"""A two-node Ray cluster on this machine: experiments run on the node they ask for.

The cluster is started with ``ray start`` (a head labelled ``node_a``, a second node labelled
``node_b``) in its own temp dir, and driven from a subprocess: one process can be connected
to one Ray cluster only, and this one is already connected to the shared test cluster.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from autotune.runner import free_port

pytestmark = pytest.mark.ray
ROOT = Path(__file__).resolve().parents[2]
# A throwaway cluster on localhost: no token to generate and hand to every process; and no
# node declared dead for heartbeats that a busy machine delays (the GCS's default gives up
# after ~15 s of them: seen once under the whole suite on 2 cores), as this test is about
# placement, not about losing a node.
CLUSTER_ENV = {"RAY_AUTH_MODE": "disabled", "RAY_health_check_failure_threshold": "60"}

_DRIVER = """
import json, sys, time

import ray

from autotune.runner.ray_runner import RayRunner
from tests.runner.specs import spec, stand_in, stand_in_rank

address = sys.argv[1]
report = {}
# Where a rank runs is the actors' placement: ranks that only sleep show it (no torch to load
# in each actor); the spread one trains, its process group spanning both nodes.
sleeping = {"rank_fn": stand_in_rank, "preload_torch": False}
for name, options, experiment in [
    ("node_a", {"resources_per_rank": {"node_a": 0.5}, **sleeping}, stand_in("node_a", 2)),
    ("node_b", {"resources_per_rank": {"node_b": 0.5}, **sleeping}, stand_in("node_b", 2)),
    ("spread", {"strategy": "SPREAD"}, spec("spread")),
]:
    with RayRunner(address, **options) as runner:
        # Both nodes up, and the last runner's actors gone (SPREAD is best effort: it packs
        # onto one node if the other looks busy).
        deadline = time.monotonic() + 60
        while ray.available_resources().get("CPU", 0) < 4:
            if time.monotonic() > deadline:
                sys.exit(f"{name}: the cluster's CPUs {ray.available_resources()} after 60 s")
            time.sleep(0.2)
        result = runner.run(experiment)
        report[name] = {
            "status": result.status.value, "nodes": result.node_ids, "error": result.error
        }
alive = [n for n in ray.nodes() if n["Alive"]]
report["labels"] = {n["NodeID"]: [k for k in n["Resources"] if "node_" in k] for n in alive}
print(json.dumps(report))
"""


def _ray_start(*args: str, temp_dir: str) -> subprocess.Popen[bytes]:
    """A Ray node in its own process group (so that it can be stopped as a whole), every
    port chosen free: the shared test cluster runs on this machine too."""
    ports = {
        "--node-manager-port": free_port(),
        "--object-manager-port": free_port(),
        "--dashboard-agent-listen-port": free_port(),
        "--dashboard-agent-grpc-port": free_port(),
        "--metrics-export-port": free_port(),
        "--runtime-env-agent-port": free_port(),
    }
    command = ["ray", "start", "--block", "--disable-usage-stats", *args]
    command += [str(x) for pair in ports.items() for x in pair]
    env = {**os.environ, **CLUSTER_ENV, "RAY_TMPDIR": temp_dir}
    return subprocess.Popen(
        command,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )


def _wait_for_port(port: int, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.2)
    raise TimeoutError(f"nothing listens on port {port} after {timeout_s:g} s")


@pytest.fixture
def two_node_cluster() -> Iterator[str]:
    # Short: Ray puts unix sockets under it, and their paths are limited to ~100 characters.
    temp_dir = tempfile.mkdtemp(prefix="at-ray-", dir="/tmp")
    port = free_port()
    nodes = [
        _ray_start(
            "--head",
            "--port",
            str(port),
            "--num-cpus",
            "2",
            "--resources",
            '{"node_a": 1}',
            "--temp-dir",
            temp_dir,
            "--include-dashboard",
            "false",
            "--dashboard-port",
            str(free_port()),
            temp_dir=temp_dir,
        )
    ]
    try:
        _wait_for_port(port)
        address = f"127.0.0.1:{port}"
        nodes.append(
            _ray_start(
                "--address",
                address,
                "--num-cpus",
                "2",
                "--resources",
                '{"node_b": 1}',
                temp_dir=temp_dir,
            )
        )
        yield address
    finally:
        for node in reversed(nodes):  # the whole group: ray start, gcs, raylet, workers
            os.killpg(node.pid, signal.SIGKILL)
            node.wait()
        shutil.rmtree(temp_dir, ignore_errors=True)


@pytest.mark.slow
def test_experiments_run_on_the_node_they_ask_for(two_node_cluster: str) -> None:
    env = {**os.environ, **CLUSTER_ENV, "PYTHONPATH": str(ROOT)}
    env.pop("RAY_ADDRESS", None)
    completed = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(_DRIVER), two_node_cluster],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=150,
    )
    assert completed.returncode == 0, completed.stderr[-3000:]
    report = json.loads(completed.stdout.strip().splitlines()[-1])
    node_of = {label[0]: node for node, label in report["labels"].items()}
    for label in ("node_a", "node_b"):
        assert report[label]["status"] == "ok", report[label]["error"]
        assert report[label]["nodes"] == [node_of[label]] * 2
    # SPREAD: one rank on each node, the process group spans both.
    assert report["spread"]["status"] == "ok", report["spread"]["error"]
    assert sorted(report["spread"]["nodes"]) == sorted(node_of.values())
