"""How good the cost model's predictions are, and what predicting buys a tuner: one table.

1. **Leave-out on the measured landscapes** (``results/landscapes/``, CPU, world size 2): the
   model fitted on the first k experiments ``model_based`` runs (k = 4, 8) predicts every
   other configuration the table measured ok; reported: the Spearman rank correlation of
   predicted against measured medians, and the regret of the predicted best (how far below
   the table's best the configuration the model ranks first is, by the table's medians).
2. **DeepSpeed's published autotuning tables** (DeepSpeedExamples ``autotuning/hf``: GPT2
   and GPT2-large, HF ``run_clm.py``, fp16, 1 node x 16 V100-32GB, fast mode) against
   ``autotune plan`` from the model's shape (built on the meta device, dropout 0.1 as GPT2
   trains) and the V100 datasheet alone: each stage's largest micro-batch that fits and its
   predicted throughput, the best stage, and what the model says of the stages DeepSpeed's
   run reported as 0 (failed).
3. **GPU-shaped landscapes** (:mod:`autotune.bench.simulated`: V100 / A100 / H100 nodes of 8,
   GPT models of 0.125B to 7B, constants off the datasheet, 1.5% noise) replayed with
   ``model_based``, ``random`` and ``gridsearch``: experiments until one within 2% of the
   best ran (median over seeds), the share ending within 2%, and experiments run, beside
   DeepSpeed's published experiment counts (17 for GPT2, 13 for GPT2-large).

    python experiments/bench_cost_model.py [--seeds 20] [--out results/bench_cost_model.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from autotune.bench.simulated import MODELS, simulated_landscape
from autotune.bench.stats import spearman
from autotune.bench.table import TableRunner, landscape_job, measured_configs, replay
from autotune.job import experiment_spec
from autotune.profiling.model_info import ModelInfo
from autotune.tuner import Tuner
from autotune.tuner.naming import split_repeat

LANDSCAPES = Path(__file__).resolve().parents[1] / "results" / "landscapes"
HARDWARE = ("v100-32gb", "a100-80gb", "h100-80gb")
# DeepSpeedExamples autotuning/hf/{gpt2,gpt2-large}/README.md: per stage, the best
# throughput (samples/s) and the micro-batch it ran at; 0: the stage's experiment failed.
PUBLISHED = {
    "gpt2": {
        "args": {"seq_len": 1024},
        "stages": {0: (441.693, 11), 1: (452.004, 15), 2: (0.0, 15), 3: (0.0, 15)},
        "experiments": 17,
        "minutes": 25,
    },
    "gpt2-large": {
        "args": {"seq_len": 1024, "n_layer": 36, "n_embd": 1280, "n_head": 20},
        "stages": {0: (59.0229, 2), 1: (87.3017, 3), 2: (77.8338, 3), 3: (0.0, 3)},
        "experiments": 13,
        "minutes": 27,
    },
}
DROPOUT = {"resid_pdrop": 0.1, "embd_pdrop": 0.1, "attn_pdrop": 0.1}  # GPT2's own


def leave_out(table: Mapping[str, Any], k: int, seed: int) -> dict[str, float]:
    """Fit on the first ``k`` experiments ``model_based`` runs; predict every other ok
    configuration of the table."""
    job = landscape_job(table, tuner_type="model_based", seed=seed)
    tuner = Tuner(
        job.config, ModelInfo(**table["model_info"]), device_memory_bytes=job.memory_budget
    )
    runner = TableRunner(table, seed)
    results = []
    while len(results) < k and (candidate := tuner.ask()) is not None:
        results.append(runner.run(experiment_spec(job, candidate, None)))
        tuner.tell(results[-1])
    told = {split_repeat(result.name)[0] for result in results}
    rest = [r for r in measured_configs(table) if r.name not in told]
    predictions = tuner.predicted(r.name for r in rest)
    values = [(r.value, predictions[r.name], r.name) for r in rest if r.name in predictions]
    best_value = measured_configs(table)[0].value
    predicted_best = max(values, key=lambda v: v[1])
    return {
        "k": k,
        "predicted": len(values),
        "spearman": spearman([v[1] for v in values], [v[0] for v in values]),
        "regret": 1.0 - predicted_best[0] / best_value,
    }


def published() -> list[dict[str, Any]]:
    """``autotune plan`` of DeepSpeed's published GPT2 runs, stage by stage."""
    from autotune.planning import PlanRequest, make_plan

    config = {
        "fp16": {"enabled": True},
        "optimizer": {"type": "AdamW", "params": {"lr": 5e-5}},
        "zero_optimization": {"stage": "all"},
        "autotuning": {"fast": True},
    }
    rows = []
    for model, facts in PUBLISHED.items():
        request = PlanRequest(
            config=config,
            workload="hf:gpt2",
            workload_args={**facts["args"], **DROPOUT},
            world_size=16,
            gpus_per_node=16,
            hardware="v100-32gb",
        )
        plan = make_plan(request).rows
        best_by_stage = {}
        largest = {}
        for row in plan:
            if row.fits:
                best_by_stage.setdefault(row.zero_stage, row)
                largest[row.zero_stage] = max(largest.get(row.zero_stage, 0), row.micro_batch_size)
        predicted_best = next(r for r in plan if r.fits)
        for stage in range(4):
            value, micro = facts["stages"][stage]
            ours = best_by_stage.get(stage)
            rows.append(
                {
                    "model": model,
                    "stage": stage,
                    "deepspeed_throughput": value,
                    "deepspeed_micro_batch": micro,
                    "predicted_largest_micro_batch": largest.get(stage),
                    "predicted_best_micro_batch": ours.micro_batch_size if ours else None,
                    "predicted_throughput": ours.throughput if ours else None,
                    "predicted_range": (ours.throughput_low, ours.throughput_high)
                    if ours
                    else None,
                    "predicted_best_stage": predicted_best.zero_stage,
                    "deepspeed_best_stage": max(
                        facts["stages"], key=lambda s: facts["stages"][s][0]
                    ),
                }
            )
    return rows


def simulated(seeds: int) -> list[dict[str, Any]]:
    rows = []
    for model in MODELS.values():
        for hardware in HARDWARE:
            table = simulated_landscape(model, hardware, world_size=8, seed=0)
            row: dict[str, Any] = {"model": model.name, "hardware": hardware}
            for tuner_type in ("model_based", "random", "gridsearch"):
                runs = [replay(table, tuner_type, seed) for seed in range(seeds)]
                never = 10**6
                reach = [r.experiments_to(0.98) or never for r in runs]
                row[tuner_type] = {
                    "to_within_2pct_median": statistics.median(reach),
                    "ends_within_2pct": sum(r.ends_within(0.98) for r in runs) / len(runs),
                    "experiments_run_median": statistics.median(len(r.names) for r in runs),
                }
            rows.append(row)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=20)
    parser.add_argument("--out", type=Path, default=Path("results/bench_cost_model.json"))
    args = parser.parse_args()

    print("1. leave-out on the measured CPU landscapes (fitted on model_based's first k)")
    print(f"{'landscape':18s} {'k':>3s} {'predicted':>9s} {'spearman':>8s} {'regret':>7s}")
    leave = []
    for path in sorted(LANDSCAPES.glob("*.json")):
        table = json.loads(path.read_text())
        for k in (4, 8):
            row = {"landscape": path.stem, **leave_out(table, k, seed=0)}
            leave.append(row)
            print(
                f"{path.stem:18s} {k:3d} {row['predicted']:9d} {row['spearman']:8.2f} "
                f"{row['regret']:7.1%}"
            )

    print("\n2. DeepSpeed's published runs (16 x V100-32GB, fp16) vs autotune plan")
    print(
        f"{'model':11s} {'stage':>5s} {'DS samples/s @mbs':>18s} {'plan: largest fit':>17s} "
        f"{'plan: samples/s (80%)':>24s}"
    )
    pub = published()
    for row in pub:
        ds = (
            f"{row['deepspeed_throughput']:.1f} @{row['deepspeed_micro_batch']}"
            if row["deepspeed_throughput"]
            else f"failed @{row['deepspeed_micro_batch']}"
        )
        ours = (
            f"{row['predicted_throughput']:.0f} ({row['predicted_range'][0]:.0f}-"
            f"{row['predicted_range'][1]:.0f})"
            if row["predicted_throughput"]
            else "does not fit"
        )
        print(
            f"{row['model']:11s} {row['stage']:5d} {ds:>18s} "
            f"{row['predicted_largest_micro_batch'] or '-':>17} {ours:>24s}"
        )
    for model in PUBLISHED:
        first = next(r for r in pub if r["model"] == model)
        print(
            f"{model}: best stage DeepSpeed z{first['deepspeed_best_stage']}, plan "
            f"z{first['predicted_best_stage']}"
        )

    print(f"\n3. GPU-shaped landscapes, {args.seeds} seeds: experiments to within 2% (median)")
    print(f"{'model':9s} {'hardware':10s} {'model_based':>22s} {'random':>22s} {'gridsearch':>22s}")
    sim = simulated(args.seeds)
    for row in sim:
        cells = []
        for tuner_type in ("model_based", "random", "gridsearch"):
            r = row[tuner_type]
            cells.append(
                f"{r['to_within_2pct_median']:>4g} ({r['ends_within_2pct']:.0%}, "
                f"{r['experiments_run_median']:g} run)"
            )
        print(f"{row['model']:9s} {row['hardware']:10s} " + " ".join(f"{c:>22s}" for c in cells))
    print("DeepSpeed's autotuner, published: GPT2 17 experiments (25 min), GPT2-large 13 (27 min)")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(
        json.dumps({"leave_out": leave, "published": pub, "simulated": sim}, indent=2) + "\n"
    )


if __name__ == "__main__":
    main()
