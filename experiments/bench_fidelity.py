"""How far the built-in engine's ranking transfers to DeepSpeed: one grid, both engines.

The default gpt workload (2 layers, d_model 256, seq 128, vocab 8192, AdamW, fp32) at world
size 2, ZeRO stages 0-3 x micro-batches (default 8, 16, 32), every configuration measured on
the built-in engine and on the installed DeepSpeed (``autotuning.engine``), each experiment in
fresh processes (the local runner), timed the same way (end to end, a barrier after each
step). Each round runs the grid in a new random order with the engines alternating, so drift on
the machine falls on both alike.

Prints each configuration's median samples/s on both engines, then per engine best / worst,
the Spearman rank correlation between the engines, and the built-in engine's pick measured on
DeepSpeed as a share of DeepSpeed's best. Writes every measurement to
``results/bench_fidelity.json`` (``--out`` elsewhere). Needs DeepSpeed (``bash install.sh
deepspeed``).

    python experiments/bench_fidelity.py [--rounds 3] [--micro-batches 8 16 32]
        [--start-profile-step 3] [--end-profile-step 12] [--world-size 2]
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import statistics
from collections.abc import Sequence
from datetime import datetime, timezone
from pathlib import Path

from bench_specs import timed_spec  # type: ignore[import-not-found]

from autotune.bench.stats import spearman
from autotune.defaults import DEFAULT_WORKLOAD
from autotune.experiment import ExperimentSpec
from autotune.runner import LocalRunner
from autotune.runner.deepspeed_engine import installed_deepspeed

ROOT = Path(__file__).resolve().parents[1]
ENGINES = ("deepspeed", "builtin")


def grid_spec(
    stage: int, micro: int, engine: str, args: argparse.Namespace, round_index: int
) -> ExperimentSpec:
    config = {
        "train_micro_batch_size_per_gpu": micro,
        "gradient_accumulation_steps": 1,
        "train_batch_size": micro * args.world_size,
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
        "zero_optimization": {"stage": stage},
        "steps_per_print": 10**6,
    }
    return timed_spec(
        f"{engine}_z{stage}_mbs{micro}_r{round_index}",
        config,
        args,
        workload=DEFAULT_WORKLOAD,
        workload_args={},
        engine=engine,
    )


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--micro-batches", type=int, nargs="+", default=[8, 16, 32])
    parser.add_argument("--stages", type=int, nargs="+", default=[0, 1, 2, 3])
    parser.add_argument("--start-profile-step", type=int, default=3)
    parser.add_argument("--end-profile-step", type=int, default=12)
    parser.add_argument("--world-size", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=ROOT / "results" / "bench_fidelity.json")
    args = parser.parse_args(argv)
    version = installed_deepspeed()
    shuffle = random.Random(args.seed)
    grid = [(stage, micro) for stage in args.stages for micro in args.micro_batches]
    runs: list[dict[str, object]] = []
    runner = LocalRunner()
    for round_index in range(args.rounds):
        order = grid[:]
        shuffle.shuffle(order)
        for position, (stage, micro) in enumerate(order):
            # Engines alternate which goes first, so neither always follows the other.
            engines = ENGINES if (position + round_index) % 2 == 0 else ENGINES[::-1]
            for engine in engines:
                result = runner.run(grid_spec(stage, micro, engine, args, round_index))
                value = result.metrics.throughput if result.ok and result.metrics else None
                runs.append(
                    {
                        "engine": engine,
                        "stage": stage,
                        "micro_batch": micro,
                        "round": round_index,
                        "status": result.status.value,
                        "throughput": value,
                        "error": result.error,
                    }
                )
                shown = f"{value:.1f}" if value is not None else result.status.value
                print(
                    f"round {round_index} {engine:9s} z{stage} mbs{micro:<3d} {shown}", flush=True
                )

    medians: dict[str, dict[tuple[int, int], float]] = {engine: {} for engine in ENGINES}
    for engine in ENGINES:
        for key in grid:
            values = [
                float(r["throughput"])  # type: ignore[arg-type]
                for r in runs
                if r["engine"] == engine
                and (r["stage"], r["micro_batch"]) == key
                and r["throughput"] is not None
            ]
            if values:
                medians[engine][key] = statistics.median(values)
    measured = [key for key in grid if all(key in medians[e] for e in ENGINES)]
    ds, ours = medians["deepspeed"], medians["builtin"]
    print(f"\nsamples/s, median of {args.rounds} rounds (DeepSpeed {version} vs built-in)")
    print("| ZeRO stage | micro-batch | DeepSpeed | built-in | built-in / DeepSpeed |")
    print("|---|---|---|---|---|")
    for key in measured:
        stage, micro = key
        print(
            f"| {stage} | {micro} | {ds[key]:.1f} | {ours[key]:.1f} | {ours[key] / ds[key]:.2f} |"
        )
    summary: dict[str, object] = {}
    if measured:
        ds_best = max(measured, key=lambda k: ds[k])
        our_pick = max(measured, key=lambda k: ours[k])
        summary = {
            "deepspeed_best_over_worst": max(ds[k] for k in measured)
            / min(ds[k] for k in measured),
            "builtin_best_over_worst": max(ours[k] for k in measured)
            / min(ours[k] for k in measured),
            "spearman": spearman([ds[k] for k in measured], [ours[k] for k in measured]),
            "deepspeed_best": {"stage": ds_best[0], "micro_batch": ds_best[1]},
            "builtin_pick": {"stage": our_pick[0], "micro_batch": our_pick[1]},
            "builtin_pick_on_deepspeed_share": ds[our_pick] / ds[ds_best],
        }
        print(
            f"\nbest/worst: DeepSpeed {summary['deepspeed_best_over_worst']:.2f}, built-in "
            f"{summary['builtin_best_over_worst']:.2f}; Spearman rank correlation "
            f"{summary['spearman']:.2f}\nDeepSpeed's best: ZeRO-{ds_best[0]} micro-batch "
            f"{ds_best[1]}; the built-in engine's pick, ZeRO-{our_pick[0]} micro-batch "
            f"{our_pick[1]}, runs on DeepSpeed at {summary['builtin_pick_on_deepspeed_share']:.2f}"
            " of DeepSpeed's best"
        )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(
        json.dumps(
            {
                "how": {
                    "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                    "machine": f"{platform.machine()}, {platform.node()}",
                    "deepspeed": version,
                    "workload": DEFAULT_WORKLOAD,
                    "world_size": args.world_size,
                    "rounds": args.rounds,
                    "profile_steps": [args.start_profile_step, args.end_profile_step],
                },
                "runs": runs,
                "summary": summary,
            },
            indent=1,
        )
        + "\n"
    )
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
