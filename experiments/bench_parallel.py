"""Tuning wall time with 1, 2 and 4 experiments at once on a simulated multi-node cluster.

The cluster is ``ray.cluster_utils.Cluster`` on this machine: 2 nodes of 4 logical GPUs and 4
CPUs each, so 4 gangs of world size 2 fit (two per node, STRICT_PACK). Every rank sleeps a fixed
time instead of training (``tests.runner.sim_cluster.sleep_rank``) and reports metrics that
depend only on the config, so every K runs the same search (a full gridsearch: every ZeRO
stage, micro-batches 1-8, two knobs, ``fast: false``, re-measurements) and only the wall time
differs. What stays of the speed-up is what the real loop loses: the tuner's phase barriers
(a phase ends when all its results are in), and the driver's cost per experiment.

The runner's warm actors are started once, before any timed run (a real cluster keeps them
warm the same way); the K values are then run in interleaved rounds.

    python experiments/bench_parallel.py [--seconds 1.0] [--rounds 2]

Prints a table and writes every figure to ``results/bench_parallel.json``. Target (issue 13):
speed-up >= 0.85 x K.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # for tests.runner.sim_cluster

from autotune.results import load_results  # noqa: E402
from autotune.tuning import tune  # noqa: E402
from tests.runner.sim_cluster import simulated_cluster, sleep_rank, tuning_job  # noqa: E402

RESULTS = ROOT / "results" / "bench_parallel.json"
TARGET_EFFICIENCY = 0.85
CONCURRENCY = (1, 2, 4)
NODES, GPUS_PER_NODE, CPUS_PER_NODE = 2, 4, 4
BENCH_CONFIG: dict[str, Any] = {
    "train_micro_batch_size_per_gpu": [1, 2, 4, 8],
    "optimizer": {"type": "AdamW", "params": {"lr": 1e-4}},
    "zero_optimization": {
        "stage": "all",
        "reduce_bucket_size": [5e7, 5e8],
        "overlap_comm": [False, True],
    },
    "autotuning": {
        "tuner_type": "gridsearch",
        "fast": False,
        "tuner_early_stopping": 1000,
        "num_tuning_micro_batch_sizes": 4,
        "num_remeasure": 2,
        "start_profile_step": 1,
        "end_profile_step": 2,
    },
}


def _run(runner: Any, concurrency: int, scratch: Path) -> dict[str, Any]:
    results_dir = Path(tempfile.mkdtemp(dir=scratch))
    started = time.perf_counter()
    report = tune(tuning_job(results_dir, BENCH_CONFIG), runner, max_concurrent=concurrency)
    wall_s = time.perf_counter() - started
    frame = load_results(results_dir)
    return {
        "concurrency": concurrency,
        "wall_s": wall_s,
        "experiments": report.num_run_now,
        "names": sorted(frame["name"]),
        "experiment_s_total": float(frame["duration_s"].sum()),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=1.0, help="each experiment's duration")
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()

    import ray

    from autotune.runner.ray_runner import RayRunner

    scratch = Path(tempfile.mkdtemp(prefix="bench-parallel-"))
    runs: list[dict[str, Any]] = []
    with simulated_cluster(NODES, GPUS_PER_NODE, CPUS_PER_NODE) as (address, env):
        os.environ.update({k: env[k] for k in ("RAY_TMPDIR", "RAY_AUTH_MODE")})
        os.environ.pop("RAY_ADDRESS", None)
        rank_fn = functools.partial(sleep_rank, seconds=args.seconds, log_dir=str(scratch))
        with RayRunner(address, rank_fn=rank_fn, preload_torch=False) as runner:
            assert runner.capacity(2) == max(CONCURRENCY), runner.capacity(2)
            _run(runner, max(CONCURRENCY), scratch)  # starts every warm gang once, untimed
            for round_index in range(args.rounds):
                for concurrency in CONCURRENCY:
                    run = _run(runner, concurrency, scratch)
                    run["round"] = round_index
                    runs.append(run)
                    print(
                        f"round {round_index} K={concurrency}: {run['wall_s']:.1f} s, "
                        f"{run['experiments']} experiments",
                        flush=True,
                    )
        ray.shutdown()

    same_experiments = len({tuple(r["names"]) for r in runs}) == 1
    baseline = statistics.median(r["wall_s"] for r in runs if r["concurrency"] == 1)
    rows = []
    for concurrency in CONCURRENCY:
        wall = statistics.median(r["wall_s"] for r in runs if r["concurrency"] == concurrency)
        speed_up = baseline / wall
        rows.append(
            {
                "concurrency": concurrency,
                "median_wall_s": wall,
                "speed_up": speed_up,
                "efficiency": speed_up / concurrency,
                "meets_target": speed_up >= TARGET_EFFICIENCY * concurrency,
            }
        )
    experiments = runs[0]["experiments"]
    print(
        f"\n{experiments} experiments of {args.seconds:g} s each, "
        f"{NODES} nodes x {GPUS_PER_NODE} logical GPUs, world size 2, median of {args.rounds}"
    )
    print(f"{'K':>3} {'wall s':>8} {'speed-up':>9} {'x K':>6} {'target':>8}")
    for row in rows:
        print(
            f"{row['concurrency']:>3} {row['median_wall_s']:>8.1f} {row['speed_up']:>9.2f} "
            f"{row['efficiency']:>6.2f} {'met' if row['meets_target'] else 'MISSED':>8}"
        )
    print(f"same experiments at every K: {same_experiments}")
    RESULTS.write_text(
        json.dumps(
            {
                "machine": f"{platform.machine()}, {os.cpu_count()} cores, {platform.system()}",
                "seconds_per_experiment": args.seconds,
                "cluster": {"nodes": NODES, "gpus": GPUS_PER_NODE, "cpus": CPUS_PER_NODE},
                "same_experiments_at_every_k": same_experiments,
                "rows": rows,
                "runs": [{k: v for k, v in r.items() if k != "names"} for r in runs],
            },
            indent=2,
        )
        + "\n"
    )


if __name__ == "__main__":
    main()
