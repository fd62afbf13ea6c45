"""Time to the answer of the default run: its wall time against one pass over what it searched.

Runs ``autotune run --metric throughput`` (the built-in config and workload, world size 2) as
a user would, in a fresh results directory each round, and reports per round:

- **wall**: the command's wall time, start to exit (Ray's start and stop included);
- **one pass**: the sum of warm-up + window of the first measurement of each configuration it
  searched: what measuring each once costs, with nothing around it;
- **ratio**: wall / one pass (the target: at most 1.5);
- the experiments it ran, how many were re-measurements, and the winner.

``--num-trials N`` adds the same run capped at N experiments (it must run at most N).

    python experiments/bench_time_to_answer.py [--rounds 3] [--num-trials 8]

Prints a table and writes every figure to ``results/bench_time_to_answer.json``. Run it on a
quiet machine: the ranks use every core.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "results" / "bench_time_to_answer.json"
TARGET_RATIO = 1.5


def one_round(num_trials: int | None) -> dict[str, Any]:
    """One ``autotune run --metric throughput`` in a fresh directory, and its figures."""
    with tempfile.TemporaryDirectory(prefix="autotune-tta-") as work:
        command = [sys.executable, "-m", "autotune", "run", "--metric", "throughput"]
        if num_trials is not None:
            command += ["--num-trials", str(num_trials)]
        started = time.monotonic()
        done = subprocess.run(command, cwd=work, capture_output=True, text=True, check=False)
        wall = time.monotonic() - started
        if done.returncode != 0:
            raise SystemExit(f"autotune run failed ({done.returncode}):\n{done.stderr[-2000:]}")
        records = [
            json.loads(line)
            for line in (Path(work) / "autotuning_results" / "experiments.jsonl")
            .read_text()
            .splitlines()
            if line.strip()
        ]
        summary = json.loads((Path(work) / "autotuning_results" / "summary.json").read_text())
    one_pass = sum(
        r["timings"]["warmup_s"] + r["timings"]["window_s"]
        for r in records
        if r.get("repeat_of") is None
    )
    return {
        "num_trials": num_trials,
        "wall_s": wall,
        "one_pass_s": one_pass,
        "ratio": wall / one_pass if one_pass else None,
        "experiments": len(records),
        "remeasured": sum(1 for r in records if r.get("repeat_of") is not None),
        "best": (summary.get("best") or {}).get("name"),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3, help="runs of each kind, interleaved")
    parser.add_argument("--num-trials", type=int, default=None, help="also run with this cap")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()

    kinds: list[int | None] = [None] + ([args.num_trials] if args.num_trials else [])
    rows = [one_round(kind) for _ in range(args.rounds) for kind in kinds]

    header = ("run", "wall s", "one pass s", "ratio", "exps", "repeats")
    print("{:<22} {:>7} {:>10} {:>6} {:>5} {:>8}  best".format(*header))
    for row in rows:
        label = "default" if row["num_trials"] is None else f"--num-trials {row['num_trials']}"
        print(
            f"{label:<22} {row['wall_s']:7.1f} {row['one_pass_s']:10.1f} {row['ratio']:6.2f} "
            f"{row['experiments']:5d} {row['remeasured']:8d}  {row['best']}"
        )
    defaults = [r for r in rows if r["num_trials"] is None]
    median_ratio = statistics.median(r["ratio"] for r in defaults)
    print(f"default run: median ratio {median_ratio:.2f} (target <= {TARGET_RATIO})")
    if args.num_trials:
        capped = [r["experiments"] for r in rows if r["num_trials"] == args.num_trials]
        print(f"--num-trials {args.num_trials}: at most {max(capped)} experiments")
    args.out.write_text(
        json.dumps(
            {
                "machine": {"platform": platform.platform(), "cpus": os.cpu_count()},
                "target_ratio": TARGET_RATIO,
                "median_ratio": median_ratio,
                "rows": rows,
            },
            indent=2,
        )
        + "\n"
    )


if __name__ == "__main__":
    main()
