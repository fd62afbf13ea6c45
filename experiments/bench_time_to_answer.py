"""Time to the answer of the default run: its wall time against one pass over what it searched.

Runs ``autotune run --metric throughput`` (the built-in config and workload, world size 2) as
a user would, in a fresh results directory each round, and reports per round:

- **wall**: the command's wall time, start to exit (Ray's start and stop included);
- **one pass**: the sum of warm-up + window of the first measurement of each configuration it
  searched: what measuring each once costs, with nothing around it;
- **ratio**: wall / one pass (the target: at most 1.5);
- the experiments it ran, how many were re-measurements, and the winner.

``--num-trials N`` adds the same run capped at N experiments (it must run at most N).
``--busy`` adds the same run with one core kept busy by another process from 15 s to 55 s
(``--busy-from``, ``--busy-for``): every ZeRO stage's best must stay >= 0.85 of the best,
and ``autotune report`` must name what ``autotune best`` names.

    python experiments/bench_time_to_answer.py [--rounds 3] [--num-trials 8] [--busy]

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
BUSY_TARGET = 0.85  # every stage's best, as a share of the best, with a core kept busy


def one_round(num_trials: int | None, busy: tuple[float, float] | None = None) -> dict[str, Any]:
    """One ``autotune run --metric throughput`` in a fresh directory, and its figures
    (``busy``: a core kept busy from ``busy[0]`` s for ``busy[1]`` s)."""
    with tempfile.TemporaryDirectory(prefix="autotune-tta-") as work:
        command = [sys.executable, "-m", "autotune", "run", "--metric", "throughput"]
        if num_trials is not None:
            command += ["--num-trials", str(num_trials)]
        started = time.monotonic()
        with open(Path(work) / "run.log", "wb") as log:
            run = subprocess.Popen(command, cwd=work, stdout=log, stderr=subprocess.STDOUT)
            if busy is not None:
                _keep_a_core_busy(run, started, *busy)
            run.wait()
        wall = time.monotonic() - started
        if run.returncode != 0:
            output = (Path(work) / "run.log").read_text()[-2000:]
            raise SystemExit(f"autotune run failed ({run.returncode}):\n{output}")
        report = _cli(work, "report", "-f", "json")
        named_best = _cli(work, "best").strip()
        log_text = (Path(work) / "autotuning_results" / "experiments.jsonl").read_text()
        records = [json.loads(line) for line in log_text.splitlines() if line.strip()]
        summary = json.loads((Path(work) / "autotuning_results" / "summary.json").read_text())
    best = summary.get("best") or {}
    per_stage = [entry["value"] for entry in (summary.get("best_per_variant") or {}).values()]
    worst = min(per_stage) / best["value"] if per_stage and best else None
    if busy is not None and worst is not None and worst < BUSY_TARGET:
        kept = Path(tempfile.mkdtemp(prefix="autotune-tta-busy-"))
        (kept / "experiments.jsonl").write_text(log_text)
        print(f"a stage's best at {worst:.2f} of the best: its log is kept in {kept}")
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
        "best": best.get("name"),
        "busy": list(busy) if busy else None,
        "worst_stage_over_best": worst,
        "report_names_best": json.loads(report)[0]["name"] == best.get("name")
        and Path(named_best).name == Path(summary.get("optimal_config") or "").name,
    }


def _cli(work: str, *args: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "autotune", *args],
        cwd=work,
        capture_output=True,
        text=True,
        check=True,
    )
    return done.stdout


def _keep_a_core_busy(
    run: subprocess.Popen[bytes], started: float, start: float, seconds: float
) -> None:
    """A process spinning on one core from ``start`` s after ``started`` for ``seconds``, or
    until ``run`` ends."""
    while time.monotonic() - started < start:
        if run.poll() is not None:
            return
        time.sleep(0.1)
    spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        while time.monotonic() - started < start + seconds and run.poll() is None:
            time.sleep(0.1)
    finally:
        spinner.kill()
        spinner.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3, help="runs of each kind, interleaved")
    parser.add_argument("--num-trials", type=int, default=None, help="also run with this cap")
    parser.add_argument("--busy", action="store_true", help="also run with a core kept busy")
    parser.add_argument("--busy-from", type=float, default=15.0, help="seconds into the run")
    parser.add_argument("--busy-for", type=float, default=40.0, help="seconds")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()

    busy = (args.busy_from, args.busy_for)
    kinds: list[tuple[int | None, tuple[float, float] | None]] = [(None, None)]
    kinds += [(args.num_trials, None)] if args.num_trials else []
    kinds += [(None, busy)] if args.busy else []
    rows = [one_round(*kind) for _ in range(args.rounds) for kind in kinds]

    header = ("run", "wall s", "one pass s", "ratio", "exps", "repeats")
    print("{:<22} {:>7} {:>10} {:>6} {:>5} {:>8}  best".format(*header))
    for row in rows:
        label = "default" if row["num_trials"] is None else f"--num-trials {row['num_trials']}"
        label += ", a core busy" if row["busy"] else ""
        print(
            f"{label:<22} {row['wall_s']:7.1f} {row['one_pass_s']:10.1f} {row['ratio']:6.2f} "
            f"{row['experiments']:5d} {row['remeasured']:8d}  {row['best']}"
            + (
                f" (worst stage {row['worst_stage_over_best']:.2f} of the best; report = best: "
                f"{row['report_names_best']})"
                if row["busy"]
                else ""
            )
        )
    defaults = [r for r in rows if r["num_trials"] is None and not r["busy"]]
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
