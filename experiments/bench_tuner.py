"""How fast each tuner finds a good config, on real experiments.

Runs the built-in gpt workload at world size 2 over the full (``fast: false``) space three
times, with gridsearch (every point), random and model_based (each capped at a quarter of the
grid's size), and reports for each: experiments and wall time until it had run a config worth
>= 97% of the grid's best. A config's worth is its grid measurement, so all three tuners are
judged on the same numbers despite run-to-run noise.

    python experiments/bench_tuner.py [--runner ray|local] [--out results/bench_tuner.json]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path
from typing import Any

from autotune.config import load_config
from autotune.config.sizes import parse_size
from autotune.defaults import DEFAULT_CONFIG, DEFAULT_CPU_DEVICE_MEMORY
from autotune.tuner import split_repeat
from autotune.tuning import TuningEvent, TuningJob, tune

TARGET = 0.97


def run_tuner(
    tuner_type: str, num_trials: int, results_dir: Path, runner: Any, max_micro_batch: int
) -> list[dict[str, Any]]:
    """One tuning run; returns its experiments in order with their finish times."""
    spec = json.loads(json.dumps(DEFAULT_CONFIG))
    spec["autotuning"].update(
        tuner_type=tuner_type,
        fast=False,
        tuner_num_trials=num_trials,
        tuner_early_stopping=10_000,  # judge the search itself, not when it gives up
        num_remeasure=0,
        results_dir=str(results_dir),
        max_train_micro_batch_size_per_gpu=max_micro_batch,
    )
    job = TuningJob(
        config=load_config(spec, world_size=2),
        results_dir=results_dir,
        device_memory_bytes=parse_size(DEFAULT_CPU_DEVICE_MEMORY),
        overwrite=True,
    )
    started = time.monotonic()
    timeline: list[dict[str, Any]] = []

    def record(event: TuningEvent) -> None:
        if event.kind == "finished" and event.result is not None:
            metrics = event.result.metrics
            timeline.append(
                {
                    "name": split_repeat(event.result.name)[0],
                    "status": event.result.status.value,
                    "throughput": metrics.throughput if metrics else None,
                    "elapsed_s": time.monotonic() - started,
                }
            )

    tune(job, runner, on_event=record)
    return timeline


def reach(timeline: list[dict[str, Any]], worth: dict[str, float], goal: float) -> dict[str, Any]:
    """Experiments and seconds until a config worth >= goal had been run."""
    best = 0.0
    for index, entry in enumerate(timeline, start=1):
        best = max(best, worth.get(entry["name"], 0.0))
        if best >= goal:
            return {"experiments": index, "seconds": entry["elapsed_s"], "reached": True}
    return {"experiments": len(timeline), "seconds": timeline[-1]["elapsed_s"], "reached": False}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runner", choices=["ray", "local"], default="ray")
    parser.add_argument("--out", type=Path, default=Path("results/bench_tuner.json"))
    parser.add_argument(
        "--max-micro-batch", type=int, default=8, help="keeps each experiment to seconds"
    )
    args = parser.parse_args()

    if args.runner == "ray":
        from autotune.runner.ray_runner import RayRunner

        runner: Any = RayRunner()
    else:
        from autotune.runner import LocalRunner

        runner = LocalRunner()
    rows = {}
    with tempfile.TemporaryDirectory() as scratch, runner:
        grid = run_tuner("gridsearch", 10_000, Path(scratch) / "grid", runner, args.max_micro_batch)
        worth = {e["name"]: e["throughput"] for e in grid if e["throughput"] is not None}
        goal = TARGET * max(worth.values())
        budget = max(1, len(grid) // 4)
        rows["gridsearch"] = reach(grid, worth, goal)
        for tuner_type in ("random", "model_based"):
            timeline = run_tuner(
                tuner_type, budget, Path(scratch) / tuner_type, runner, args.max_micro_batch
            )
            rows[tuner_type] = reach(timeline, worth, goal)
            rows[tuner_type]["budget"] = budget

    print(
        f"grid: {len(grid)} experiments, best {max(worth.values()):.2f} samples/s, "
        f"target {goal:.2f} (>= {TARGET:.0%})"
    )
    print(f"{'tuner':12s} {'experiments':>12s} {'wall s':>8s} {'vs grid (exps)':>15s} reached")
    for name, row in rows.items():
        ratio = row["experiments"] / rows["gridsearch"]["experiments"]
        print(
            f"{name:12s} {row['experiments']:12d} {row['seconds']:8.0f} {ratio:15.2f} "
            f"{row['reached']}"
        )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    figures = {"grid_size": len(grid), "target": goal, "rows": rows, "grid": grid}
    args.out.write_text(json.dumps(figures, indent=2) + "\n")


if __name__ == "__main__":
    main()
