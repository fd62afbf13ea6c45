"""How good the cost model's predictions are, and what predicting buys a tuner: one table.

1. **Leave-out on the measured landscapes** (``results/landscapes/``, CPU, world size 2): the
   model fitted on the first k experiments ``model_based`` runs (k = 4, 8) predicts every
   other configuration the table measured ok; reported: the Spearman rank correlation of
   predicted against measured medians, and the regret of the predicted best (how far below
   the table's best the configuration the model ranks first is, by the table's medians).
2. **Published tables** (``experiments/published/``; the cost model's prior is calibrated on
   those marked ``calibration``, :mod:`autotune.tuner.calibration`) against ``autotune plan``
   from the model's shape and the GPU's datasheet alone. Per DeepSpeed table (16 x V100,
   fp16/fp32, fast mode): per stage the published best and its micro-batch against the
   plan's largest fit and its prediction at that micro-batch (with its 80% interval), the
   best stage each names, and whether the plan's best stage is one whose published best is
   within 5% of the best. Per llm-foundry table (MPT, FSDP = ZeRO-3, A100/H100): predicted
   over published throughput per row; for the 7B micro-batch sweep (8 x A100-80GB), the
   plan's ranking of micro-batches and its largest fit with and without activation
   checkpointing. Coverage: the share of published throughputs inside the stated 80%
   interval. Then the **held-out** tables, printed apart: DeepSpeed's other four
   (GPT2-medium, GPT2-xl, BERT-base, BERT-large) and the H200 landscape
   (``results/landscapes/gpu-20261127``: the built-in engine, one GPU, stages 0-3 with and
   without checkpointing, its largest fits and its activations a sample), and the memory per
   GPU of published Llama runs (``experiments/published/llama_memory.json``: transformers'
   LLaMA-7B on DeepSpeed ZeRO-2/3, IBM's and torchtitan's FSDP runs of Llama 2 and 3, 7B to
   70B, with and without checkpointing, each row cited there) against the plan of
   ``hf:llama`` in their shape: whether it fits as the run did, and the predicted memory
   within 15% of the published where the row gives one.
3. **GPU-shaped landscapes** (:mod:`autotune.bench.simulated`: V100 / A100 / H100 nodes of 8,
   GPT models of 0.125B to 7B, constants off the datasheet, 1.5% noise) replayed with
   ``model_based``, ``random`` and ``gridsearch``: experiments until one within 2% of the
   best ran (median over seeds), the share ending within 2%, and experiments run, beside
   DeepSpeed's published experiment counts (17 for GPT2, 13 for GPT2-large).

    python experiments/bench_cost_model.py [--seeds 20] [--skip-simulated] [--out ...]
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from autotune.bench.published_report import print_published
from autotune.bench.simulated import MODELS, simulated_landscape
from autotune.bench.stats import spearman
from autotune.bench.table import TableRunner, landscape_job, measured_configs, replay
from autotune.job import experiment_spec
from autotune.profiling.model_info import ModelInfo
from autotune.tuner import Tuner

LANDSCAPES = Path(__file__).resolve().parents[1] / "results" / "landscapes"
HARDWARE = ("v100-32gb", "a100-80gb", "h100-80gb")


def leave_out(table: Mapping[str, Any], k: int, seed: int) -> dict[str, float]:
    """Fit on the first ``k`` experiments ``model_based`` runs; predict every other ok
    configuration of the table."""
    job = landscape_job(table, tuner_type="model_based", seed=seed)
    tuner = Tuner(
        job.config, ModelInfo(**table["model_info"]), device_memory_bytes=job.memory_budget
    )
    runner = TableRunner(table, seed)
    results, told = [], set()
    while len(results) < k and (candidate := tuner.ask()) is not None:
        results.append(runner.run(experiment_spec(job, candidate, None)))
        tuner.tell(results[-1])
        told.add(candidate.repeat_of or candidate.name)
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
    parser.add_argument("--skip-simulated", action="store_true", help="leave out part 3")
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

    pub = print_published()
    if args.skip_simulated:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"leave_out": leave, "published": pub}, indent=2) + "\n")
        return

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
