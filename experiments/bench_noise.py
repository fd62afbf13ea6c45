"""How steady one measurement is: the rank processes' allocator held steady vs glibc's defaults.

A tuner can only rank what it can tell apart, so the run-to-run noise of one experiment and
any drift with the age of the rank processes bound every tuner's result. This script measures
both for a few configurations of a landscape (its best by default), in fresh Ray clusters that
alternate between the two allocator modes (``AUTOTUNE_STEADY_ALLOCATOR`` = 1, the default, or
0: glibc's adaptive thresholds, see :func:`autotune.runner.rank.steady_allocator`). Inside a
cluster every configuration runs once per round, in a shuffled order.

Reported per mode: each configuration's median throughput (and the ratio steady / default),
one measurement's noise (the pooled log standard deviation of the repeats, per cluster), and
the drift: the first round's measurements over their configuration's median in that cluster
(1.00: the fresh processes measured like warm ones).

    python experiments/bench_noise.py [--landscape results/landscapes/gpt_long_48mib.json]
        [--configs N] [--rounds 8] [--clusters 2] [--out results/bench_noise.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
from pathlib import Path
from typing import Any

from landscape import measure, ray_runner  # type: ignore[import-not-found]

from autotune.bench.table import landscape_job, measured_configs
from autotune.profiling.model_info import ModelInfo
from autotune.runner.rank import STEADY_ALLOCATOR_ENV
from autotune.tuner import Ranked
from autotune.tuner.ranking import relative_noise

MODES = {"default": "0", "steady": "1"}


def top_configs(table: dict[str, Any], count: int) -> dict[str, dict[str, Any]]:
    """The table's ``count`` best configurations by median: name → overrides."""
    best = measured_configs(table)[:count]
    return {r.name: table["configs"][r.name]["overrides"] for r in best}


def measure_cluster(
    table: dict[str, Any], configs: dict[str, dict[str, Any]], rounds: int, mode: str
) -> dict[str, list[float]]:
    """Every configuration ``rounds`` times in one fresh Ray cluster, allocator in ``mode``."""
    os.environ[STEADY_ALLOCATOR_ENV] = MODES[mode]  # the cluster's workers inherit it
    job = landscape_job(table)
    with ray_runner(job) as runner:
        results = measure(job, ModelInfo(**table["model_info"]), runner, configs, rounds)
    return {
        name: [r.metrics.throughput for r in runs if r.ok and r.metrics]
        for name, runs in results.items()
    }


def summarise(clusters: list[dict[str, list[float]]]) -> dict[str, Any]:
    """Medians over every cluster of a mode, noise and first-round drift per cluster."""
    names = list(clusters[0])
    medians = {n: statistics.median(v for c in clusters for v in c[n]) for n in names}
    noise = []
    drift = []
    for cluster in clusters:
        ranked = [Ranked(n, statistics.median(v), tuple(v), 0) for n, v in cluster.items()]
        noise.append(relative_noise(ranked) or 0.0)
        drift.append(statistics.median(c[0] / statistics.median(c) for c in cluster.values()))
    return {
        "medians": medians,
        "noise": statistics.median(noise),
        "noise_per_cluster": noise,
        "first_round": statistics.median(drift),
        "first_round_per_cluster": drift,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--landscape", type=Path, default=Path("results/landscapes/gpt_long_48mib.json")
    )
    parser.add_argument("--configs", type=int, default=4, help="the table's best N")
    parser.add_argument("--rounds", type=int, default=8, help="repeats per cluster")
    parser.add_argument("--clusters", type=int, default=2, help="fresh clusters per mode")
    parser.add_argument("--out", type=Path, default=Path("results/bench_noise.json"))
    args = parser.parse_args()
    table = json.loads(args.landscape.read_text())
    configs = top_configs(table, args.configs)
    measured: dict[str, list[dict[str, list[float]]]] = {mode: [] for mode in MODES}
    for index in range(args.clusters):
        for mode in MODES if index % 2 == 0 else reversed(MODES):
            measured[mode].append(measure_cluster(table, configs, args.rounds, mode))
            print(f"cluster {index + 1}/{args.clusters} ({mode}) measured", flush=True)
    summary = {mode: summarise(clusters) for mode, clusters in measured.items()}
    default, steady = summary["default"], summary["steady"]
    print(
        f"\n{args.landscape.stem}: {len(configs)} configs x {args.rounds} rounds x "
        f"{args.clusters} fresh clusters per mode (samples/s, medians)"
    )
    print(f"{'config':36s} {'default':>8s} {'steady':>8s} {'ratio':>6s}")
    for name in configs:
        before, after = default["medians"][name], steady["medians"][name]
        print(f"{name:36s} {before:8.1f} {after:8.1f} {after / before:6.2f}")
    print(
        f"{'one measurement ±':36s} {default['noise']:8.1%} {steady['noise']:8.1%} "
        f"{steady['noise'] / default['noise']:6.2f}"
    )
    print(
        f"{'first round / median':36s} {default['first_round']:8.2f} {steady['first_round']:8.2f}"
    )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(
        json.dumps(
            {
                "landscape": args.landscape.stem,
                "rounds": args.rounds,
                "clusters": args.clusters,
                "summary": summary,
                "measured": measured,
            },
            indent=1,
        )
        + "\n"
    )


if __name__ == "__main__":
    main()
