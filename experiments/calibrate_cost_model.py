"""Calibrate the cost model's prior on the published tables (``experiments/published/``).

Fits, with the cost model's own formula, what DeepSpeed's runs (16 x V100) and llm-foundry's
(A100-40/80, H100) achieved of their GPUs' datasheets: each constant as a multiple of its
datasheet figure, shared by every row, and the compute rate's share per GPU
(:func:`autotune.tuner.calibration.calibrate`). Only the tables whose role is
``calibration`` are fitted; the held-out ones are for ``bench_cost_model.py``. Writes
``autotune/tuner/calibration.json``, which ``autotune plan`` and ``model_based`` start from.

    python experiments/calibrate_cost_model.py
"""

from __future__ import annotations

import json
import math
import statistics

from autotune.bench.published import DEEPSPEED, LLM_FOUNDRY, calibration_rows
from autotune.tuner.calibration import CALIBRATION_PATH, calibrate
from autotune.tuner.cost_model import CONSTANTS


def main() -> None:
    rows = calibration_rows()
    result = calibrate(rows)
    residuals = result.pop("residuals")
    units = {c.name: c.unit for c in CONSTANTS}
    print(f"{len(rows)} rows from {len(result['rows'])} tables; misfit {result['misfit']:.3f}")
    print("constants (multiples of the datasheet figure, or in their own unit):")
    for name, value in result["ratios"].items():
        print(f"  {name:28s} {value:10.4g}  {units[name]}")
    print("compute share per GPU:", {k: round(v, 3) for k, v in result["flop_rate"].items()})
    print(f"{'table':24s} {'rows':>4s} {'mean log(pred/meas)':>20s} {'sd':>6s}")
    for table, values in residuals.items():
        sd = statistics.pstdev(values) if len(values) > 1 else 0.0
        print(f"{table:24s} {len(values):4d} {statistics.fmean(values):20.3f} {sd:6.3f}")
    within = sum(abs(r) <= 1.2816 * result["misfit"] for v in residuals.values() for r in v)
    print(f"inside the 80% interval: {within}/{len(rows)}")
    data = {
        "source": [str(DEEPSPEED.name), str(LLM_FOUNDRY.name)],
        "written_by": "experiments/calibrate_cost_model.py",
        **result,
        "residual_by_table": {
            table: {
                "rows": len(values),
                "mean": statistics.fmean(values),
                "rms": math.sqrt(statistics.fmean(r * r for r in values)),
            }
            for table, values in residuals.items()
        },
    }
    CALIBRATION_PATH.write_text(json.dumps(data, indent=2) + "\n")
    print(f"wrote {CALIBRATION_PATH}")


if __name__ == "__main__":
    main()
