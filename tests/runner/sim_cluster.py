"""A simulated multi-node Ray cluster with logical GPUs, and a fake fixed-duration rank, for
testing and benchmarking experiments that run side by side.

Every node of ``ray.cluster_utils.Cluster`` runs on this machine with its own raylet and a
few logical GPUs; a rank sleeps instead of training, so K experiments at once cost no more
CPU than one. Both halves run in their own processes (one process connects to one Ray
cluster only, and the test session is already connected to the shared test cluster):

    python -m tests.runner.sim_cluster serve --nodes 3 --gpus 2     # prints the address
    python -m tests.runner.sim_cluster tune ADDRESS RESULTS_DIR --max-concurrent 3
    python -m tests.runner.sim_cluster side-by-side ADDRESS --count 4     # run_many, no tuner
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from autotune.config import load_config
from autotune.experiment import ExperimentSpec, Metrics, Status
from autotune.runner.outcome import RankOutcome
from tests.specs import job_spec

ROOT = Path(__file__).resolve().parents[2]
# The tuner profiles the workload once on the driver; the ranks never build it.
TINY_GPT = {"n_layer": 1, "d_model": 64, "n_head": 2, "seq_len": 32, "vocab": 256}
# Stages 0-3, fast mode: a probe per stage, then three micro-batches each, then re-measures.
TUNING_CONFIG: dict[str, Any] = {
    "train_micro_batch_size_per_gpu": [1, 2, 4, 8],
    "optimizer": {"type": "AdamW", "params": {"lr": 1e-4}},
    "zero_optimization": {"stage": "all"},
    "autotuning": {"tuner_type": "gridsearch", "start_profile_step": 1, "end_profile_step": 2},
}


def sleep_rank(
    spec: ExperimentSpec, rank: int, init_method: str, *, seconds: float, log_dir: str
) -> RankOutcome:
    """A rank that sleeps ``seconds`` and reports metrics that depend only on the config (so
    every run of a config measures the same), writing where it ran to ``log_dir``."""
    import ray

    context = ray.get_runtime_context()
    began = time.time()
    Path(log_dir, f"{spec.name}.{rank}.started").touch()
    time.sleep(seconds)
    placement = {
        "name": spec.name,
        "rank": rank,
        "node": context.get_node_id(),
        "gpus": [str(gpu) for gpu in ray.get_gpu_ids()],
        "placement_group": str(context.get_placement_group_id()),
        "pid": os.getpid(),
        "start": began,
        "end": time.time(),
    }
    Path(log_dir, f"{spec.name}.{rank}.{began:.6f}.json").write_text(json.dumps(placement))
    return RankOutcome(rank=rank, status=Status.ok, metrics=config_metrics(spec).to_dict())


def config_metrics(spec: ExperimentSpec) -> Metrics:
    """Metrics that depend only on the config: every run of a config measures the same."""
    config = spec.ds_config
    stage = int(config.get("zero_optimization", {}).get("stage", 0))
    micro = int(config["train_micro_batch_size_per_gpu"])
    step_s = 0.01 * micro * (1.0 + 0.07 * stage) + 0.003 * (stage - 1.5) ** 2
    return Metrics.from_window(
        [step_s] * spec.window_steps, int(config["train_batch_size"]), 1e9, 2**20 * micro
    )


def tuning_job(results_dir: Path, config: dict[str, Any] | None = None) -> Any:
    """A job for simulated runs: ``config`` (default :data:`TUNING_CONFIG`) at world size 2."""
    from autotune.job import TuningJob

    return TuningJob(
        config=load_config(config or TUNING_CONFIG, world_size=2),
        workload="gpt",
        workload_args=TINY_GPT,
        results_dir=results_dir,
    )


def start_cluster(nodes: int, gpus: int, cpus: int) -> Any:
    """``nodes`` nodes of ``gpus`` logical GPUs and ``cpus`` CPUs each, this process its
    owner (its processes end with it)."""
    from ray.cluster_utils import Cluster

    node_args = {"num_cpus": cpus, "num_gpus": gpus, "object_store_memory": 80 * 2**20}
    cluster = Cluster(
        initialize_head=True,
        head_node_args={**node_args, "include_dashboard": False},
    )
    for _ in range(nodes - 1):
        cluster.add_node(**node_args)
    cluster.wait_for_nodes()
    return cluster


def private_ray_env(temp_dir: str) -> dict[str, str]:
    """Ray's files (sockets, the "current cluster" address) under ``temp_dir``, so that a
    simulated cluster never becomes another job's ``address="auto"``; no auth token."""
    env = {**os.environ, "RAY_TMPDIR": temp_dir, "RAY_AUTH_MODE": "disabled"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    env.pop("RAY_ADDRESS", None)
    return env


@dataclass
class SimulatedCluster:
    """A running simulated cluster: where to connect, in what environment, and a way to
    take a node away."""

    address: str
    env: dict[str, str]
    _server: subprocess.Popen[str]

    def driver(self, command: list[str]) -> subprocess.Popen[str]:
        """``command`` started as a driver of this cluster, its output captured."""
        return subprocess.Popen(
            command,
            cwd=ROOT,
            env=self.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )

    def remove_worker_node(self) -> str:
        """Kill every process of one non-head node, as if its machine went away; its id."""
        assert self._server.stdin is not None and self._server.stdout is not None
        self._server.stdin.write("remove-worker\n")
        self._server.stdin.flush()
        return str(_reply(self._server, "removed"))


def _reply(server: subprocess.Popen[str], key: str) -> Any:
    """The server's next ``{key: ...}`` line (its nodes' processes log to the same stdout)."""
    assert server.stdout is not None
    for line in server.stdout:
        if line.startswith(f'{{"{key}"'):
            return json.loads(line)[key]
    raise RuntimeError(f"the simulated cluster ended (exit {server.wait()}) without {key!r}")


@contextmanager
def simulated_cluster(nodes: int, gpus: int, cpus: int) -> Iterator[SimulatedCluster]:
    """A cluster served by a child process, stopped (every node's processes) on exit."""
    temp_dir = tempfile.mkdtemp(prefix="at-sim-", dir="/tmp")  # short: unix socket paths
    env = private_ray_env(temp_dir)
    sizes = ["--nodes", str(nodes), "--gpus", str(gpus), "--cpus", str(cpus)]
    server = subprocess.Popen(
        [sys.executable, "-m", "tests.runner.sim_cluster", "serve", *sizes],
        cwd=ROOT,
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        yield SimulatedCluster(_reply(server, "address"), env, server)
    finally:
        if server.stdin is not None:
            server.stdin.close()  # asks it to shut its cluster down
        try:
            server.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait()
        subprocess.run(["rm", "-rf", temp_dir], check=False)


def tune_command(
    address: str,
    results_dir: Path,
    *,
    max_concurrent: int | None,
    seconds: float,
    log_dir: Path,
) -> list[str]:
    """The command line that tunes :data:`TUNING_CONFIG` on the cluster with sleeping ranks."""
    command = [sys.executable, "-m", "tests.runner.sim_cluster", "tune", address]
    command += [str(results_dir), "--seconds", str(seconds), "--log-dir", str(log_dir)]
    if max_concurrent is not None:
        command += ["--max-concurrent", str(max_concurrent)]
    return command


def _serve(args: argparse.Namespace) -> None:
    cluster = start_cluster(args.nodes, args.gpus, args.cpus)
    try:
        print(json.dumps({"address": cluster.address}), flush=True)
        for line in sys.stdin:  # until the parent closes our stdin (or dies)
            if line.strip() == "remove-worker":
                node = next(iter(cluster.worker_nodes))
                cluster.remove_node(node, allow_graceful=False)
                print(json.dumps({"removed": node.node_id}), flush=True)
    finally:
        cluster.shutdown()


def _side_by_side(args: argparse.Namespace) -> None:
    """Run ``--count`` experiments of world size 2 at once; report each result."""
    from autotune.runner.ray_runner import RayRunner

    rank_fn = functools.partial(sleep_rank, seconds=args.seconds, log_dir=args.log_dir)
    ds_config = {"train_micro_batch_size_per_gpu": 1, "train_batch_size": 2}
    specs = [job_spec(f"side-{i}", ds_config, end_profile_step=1) for i in range(args.count)]
    with RayRunner(args.address, rank_fn=rank_fn, preload_torch=False) as runner:
        results = [
            {"name": r.name, "status": r.status.value, "error": r.error, "nodes": r.node_ids}
            for r in runner.run_many(specs)
        ]
        print(json.dumps({"results": results}), flush=True)


def _tune(args: argparse.Namespace) -> None:
    import ray

    from autotune.runner.ray_runner import RayRunner
    from autotune.tuning import tune

    job = tuning_job(Path(args.results_dir))
    rank_fn = functools.partial(sleep_rank, seconds=args.seconds, log_dir=args.log_dir)
    runner = RayRunner(args.address, rank_fn=rank_fn, preload_torch=False)
    report: dict[str, Any] = {"capacity": {n: runner.capacity(n) for n in (1, 2, 8)}}
    try:
        started = time.perf_counter()
        tuned = tune(job, runner, max_concurrent=args.max_concurrent)
        report.update(wall_s=time.perf_counter() - started, num_run_now=tuned.num_run_now)
    finally:
        runner.close()
        ray.shutdown()
    print(json.dumps(report), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m tests.runner.sim_cluster")
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser("serve")
    serve.add_argument("--nodes", type=int, default=3)
    serve.add_argument("--gpus", type=int, default=2)
    serve.add_argument("--cpus", type=int, default=2)
    run = commands.add_parser("tune")
    run.add_argument("address")
    run.add_argument("results_dir")
    run.add_argument("--seconds", type=float, default=0.5)
    run.add_argument("--log-dir", required=True)
    run.add_argument("--max-concurrent", type=int, default=None)
    side = commands.add_parser("side-by-side")
    side.add_argument("address")
    side.add_argument("--count", type=int, default=4)
    side.add_argument("--seconds", type=float, default=5.0)
    side.add_argument("--log-dir", required=True)
    args = parser.parse_args()
    {"serve": _serve, "tune": _tune, "side-by-side": _side_by_side}[args.command](args)


if __name__ == "__main__":
    main()
