"""Time to the answer of the default run: its wall time against one pass over what it searched.

Runs ``autotune run --metric throughput`` (the built-in config and workload, world size 2) as
a user would, in a fresh results directory each round, and reports per round:

- **wall**: the command's wall time, start to exit (Ray's start and stop included);
- **one pass**: the sum of warm-up + window of the first measurement of each configuration it
  searched: what measuring each once costs, with nothing around it;
- **ratio**: wall / one pass (the target: at most 1.3);
- the experiments it ran, how many were re-measurements, and the winner.

``--num-trials N`` adds the same run capped at N experiments (it must run at most N).
``--busy`` adds the same run with one core kept busy by another process from 15 s to 55 s
(``--busy-from``, ``--busy-for``): every ZeRO stage's best must stay >= 0.85 of the best,
and ``autotune report`` must name what ``autotune best`` names.
``--neighbour`` adds the same run with a busy neighbour for the whole run: one core spun
throughout, and both cores loaded throughout. Each must take at most 2x one pass over what
it searched there, and name a winner worth >= 0.85 of the quiet runs' winner (the winner's
median in the quiet runs' reports); its noise line is printed, to be read.

    python experiments/bench_time_to_answer.py [--rounds 3] [--num-trials 8] [--busy]
        [--neighbour]

Prints a table and writes every figure to ``results/bench_time_to_answer.json``. Run it on a
quiet machine: the ranks use every core.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "results" / "bench_time_to_answer.json"
TARGET_RATIO = 1.3
BUSY_TARGET = 0.85  # every stage's best, as a share of the best, with a core kept busy
NEIGHBOUR_RATIO = 2.0  # wall / one pass with a neighbour busy throughout
NEIGHBOUR_TARGET = 0.85  # its winner, as a share of the quiet winner's value


def one_round(
    num_trials: int | None, busy: tuple[float, float] | None = None, cores: int = 1
) -> dict[str, Any]:
    """One ``autotune run --metric throughput`` in a fresh directory, and its figures
    (``busy``: ``cores`` cores kept busy from ``busy[0]`` s for ``busy[1]`` s)."""
    from autotune.results import ResultsDir

    with tempfile.TemporaryDirectory(prefix="autotune-tta-") as work:
        command = [sys.executable, "-m", "autotune", "run", "--metric", "throughput"]
        if num_trials is not None:
            command += ["--num-trials", str(num_trials)]
        started = time.monotonic()
        with open(Path(work) / "run.log", "wb") as log:
            run = subprocess.Popen(command, cwd=work, stdout=log, stderr=subprocess.STDOUT)
            if busy is not None:
                _keep_cores_busy(run, started, *busy, cores=cores)
            run.wait()
        wall = time.monotonic() - started
        if run.returncode != 0:
            output = (Path(work) / "run.log").read_text()[-2000:]
            raise SystemExit(f"autotune run failed ({run.returncode}):\n{output}")
        report = json.loads(_cli(work, "report", "-f", "json"))
        named_best = _cli(work, "best").strip()
        results_dir = Path(work) / "autotuning_results"
        records = ResultsDir(results_dir).records()
        summary = json.loads((results_dir / "summary.json").read_text())
        summary_text = (results_dir / "summary.txt").read_text()
        if busy is not None:
            kept = Path(tempfile.mkdtemp(prefix="autotune-tta-busy-"))
            shutil.copytree(results_dir, kept / "autotuning_results")
    best = summary.get("best") or {}
    per_stage = [entry["value"] for entry in (summary.get("best_per_variant") or {}).values()]
    worst = min(per_stage) / best["value"] if per_stage and best else None
    if busy is not None:
        print(f"busy run's results kept in {kept}")
    one_pass = sum(
        r["timings"]["warmup_s"] + r["timings"]["window_s"]
        for r in records
        if r.get("repeat_of") is None
    )
    noise_lines = [line for line in summary_text.splitlines() if "run to run" in line]
    return {
        "num_trials": num_trials,
        "wall_s": wall,
        "one_pass_s": one_pass,
        "ratio": wall / one_pass if one_pass else None,
        "experiments": len(records),
        "remeasured": sum(1 for r in records if r.get("repeat_of") is not None),
        "best": best.get("name"),
        "busy": list(busy) if busy and math.isfinite(busy[1]) else None,
        "busy_throughout": bool(busy) and not math.isfinite(busy[1]),
        "busy_cores": cores if busy else 0,
        "worst_stage_over_best": worst,
        "report_names_best": report[0]["name"] == best.get("name")
        and Path(named_best).name == Path(summary.get("optimal_config") or "").name,
        "noise_line": noise_lines[0] if noise_lines else None,
        "waited_s": summary.get("waited_for_quiet_s") or 0.0,
        "measured": {row["name"]: row["throughput"] for row in report if row["status"] == "ok"},
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


def _keep_cores_busy(
    run: subprocess.Popen[bytes], started: float, start: float, seconds: float, cores: int = 1
) -> None:
    """``cores`` processes spinning from ``start`` s after ``started`` for ``seconds``, or
    until ``run`` ends."""
    while time.monotonic() - started < start:
        if run.poll() is not None:
            return
        time.sleep(0.1)
    spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(cores)]
    try:
        while time.monotonic() - started < start + seconds and run.poll() is None:
            time.sleep(0.1)
    finally:
        for spinner in spinners:
            spinner.kill()
            spinner.wait()


def quiet_value(name: str | None, quiet: list[dict[str, Any]]) -> float | None:
    """The median throughput the quiet runs' reports give configuration ``name`` (None: no
    quiet run measured it)."""
    values = [row["measured"][name] for row in quiet if name in row["measured"]]
    return statistics.median(values) if values else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3, help="runs of each kind, interleaved")
    parser.add_argument("--num-trials", type=int, default=None, help="also run with this cap")
    parser.add_argument("--busy", action="store_true", help="also run with a core kept busy")
    parser.add_argument("--busy-from", type=float, default=15.0, help="seconds into the run")
    parser.add_argument("--busy-for", type=float, default=40.0, help="seconds")
    parser.add_argument(
        "--neighbour", action="store_true", help="also run with 1 and 2 cores busy throughout"
    )
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()

    busy = (args.busy_from, args.busy_for)
    throughout = (0.0, math.inf)
    kinds: list[tuple[int | None, tuple[float, float] | None, int]] = [(None, None, 1)]
    kinds += [(args.num_trials, None, 1)] if args.num_trials else []
    kinds += [(None, busy, 1)] if args.busy else []
    kinds += [(None, throughout, 1), (None, throughout, 2)] if args.neighbour else []
    rows = [one_round(*kind) for _ in range(args.rounds) for kind in kinds]

    header = ("run", "wall s", "one pass s", "ratio", "exps", "repeats", "waited s")
    print("{:<22} {:>7} {:>10} {:>6} {:>5} {:>8} {:>8}  best".format(*header))
    for row in rows:
        label = "default" if row["num_trials"] is None else f"--num-trials {row['num_trials']}"
        if row["busy_throughout"]:
            label += f", {row['busy_cores']} busy throughout"
        elif row["busy"]:
            label += ", a core busy"
        print(
            f"{label:<22} {row['wall_s']:7.1f} {row['one_pass_s']:10.1f} {row['ratio']:6.2f} "
            f"{row['experiments']:5d} {row['remeasured']:8d} {row['waited_s']:8.1f}  {row['best']}"
            + (
                f" (worst stage {row['worst_stage_over_best']:.2f} of the best; report = best: "
                f"{row['report_names_best']})"
                if row["busy"]
                else ""
            )
        )
    defaults = [
        r for r in rows if r["num_trials"] is None and not r["busy"] and not r["busy_throughout"]
    ]
    median_ratio = statistics.median(r["ratio"] for r in defaults)
    print(f"default run: median ratio {median_ratio:.2f} (target <= {TARGET_RATIO})")
    quiet_best = statistics.median(r["measured"][r["best"]] for r in defaults)
    windowed = [r for r in rows if r["busy"]]
    if windowed:
        held = sum(1 for r in windowed if (r["worst_stage_over_best"] or 0) >= BUSY_TARGET)
        print(
            f"a core busy from {args.busy_from:.0f} s for {args.busy_for:.0f} s: every stage "
            f">= {BUSY_TARGET} of the best in {held} of {len(windowed)} runs"
        )
    for cores in (1, 2) if args.neighbour else ():
        neighbour = [r for r in rows if r["busy_throughout"] and r["busy_cores"] == cores]
        for row in neighbour:
            value = quiet_value(row["best"], defaults)
            row["winner_over_quiet"] = value / quiet_best if value is not None else None
        shares = [r["winner_over_quiet"] for r in neighbour if r["winner_over_quiet"] is not None]
        good = sum(1 for share in shares if share >= NEIGHBOUR_TARGET)
        ratio = statistics.median(r["ratio"] for r in neighbour)
        print(
            f"{cores} core(s) busy throughout: ratio {ratio:.2f} (target <= {NEIGHBOUR_RATIO}); "
            f"winner >= {NEIGHBOUR_TARGET} of the quiet winner in "
            f"{good} of {len(neighbour)} runs; noise lines: "
            + " | ".join(str(r["noise_line"]) for r in neighbour)
        )
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
