"""Write ``report.md`` for ``experiments/gpu_check.sh`` from its steps and measurements.

The report names the device, says how each step went, and carries what the GPU tests
measured (the memory estimate against the allocator, a warm process after a CUDA OOM), the
tuning run's summary and the engine benchmark's tables. Exits 1 if any step failed.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any


def _steps(path: Path) -> list[dict[str, str]]:
    rows = []
    for line in path.read_text().splitlines():
        name, status, seconds, log = line.split("\t")
        rows.append({"name": name, "status": status, "seconds": seconds, "log": log})
    return rows


def _last_line(path: Path) -> str:
    lines = path.read_text(errors="replace").strip().splitlines() if path.exists() else []
    return lines[-1].strip("= ") if lines else "(no output)"


def _memory_table(data: dict[str, Any]) -> list[str]:
    lines = [
        f"Workload: gpt {data['workload']}.",
        "",
        "| stage | micro-batch | estimated MiB | measured MiB | error |",
        "|---|---|---|---|---|",
    ]
    for row in data["rows"]:
        lines.append(
            f"| {row['stage']} | {row['micro_batch']} | {row['estimated_bytes'] / 2**20:.0f} "
            f"| {row['measured_bytes'] / 2**20:.0f} | {row['error']:+.1%} |"
        )
    worst = max(abs(row["error"]) for row in data["rows"])
    verdict = "within" if worst <= 0.15 else "OUTSIDE"
    return [*lines, "", f"Largest error {worst:.1%}: {verdict} the 15% target."]


def _warm_oom(data: dict[str, Any]) -> list[str]:
    peaks, speed = data["peak_bytes"], data["throughput"]
    lines = [
        f"The out-of-memory experiment: `{data['oom_error']}`",
        "",
        "| the same experiment | peak MiB | samples/s |",
        "|---|---|---|",
    ]
    for key, label in [
        ("warm_before_oom", "warm process, before the OOM"),
        ("warm_after_oom", "warm process, after the OOM"),
        ("fresh_process", "a fresh process"),
    ]:
        lines.append(f"| {label} | {peaks[key] / 2**20:.1f} | {speed[key]:.1f} |")
    return lines


def build_report(
    steps: list[dict[str, str]], measurements: Path, output: Path, dry_run: bool
) -> str:
    environment = output / "environment.log"
    lines = [
        "# GPU check" + (" (dry run, no GPU)" if dry_run else ""),
        "",
        "`bash experiments/gpu_check.sh" + (" --dry-run" if dry_run else "") + "`",
        "",
        "## Device and versions",
        "",
        "```",
        environment.read_text().strip() if environment.exists() else "(no environment.log)",
        "```",
        "",
        "## Steps",
        "",
        "| step | status | seconds | log |",
        "|---|---|---|---|",
    ]
    lines += [f"| {s['name']} | {s['status']} | {s['seconds']} | {s['log']} |" for s in steps]
    lines += ["", f"GPU tests: {_last_line(output / 'pytest.log')}", ""]
    memory = measurements / "memory_estimate.json"
    if memory.exists():
        lines += ["## Memory estimate against the CUDA allocator", ""]
        lines += [*_memory_table(json.loads(memory.read_text())), ""]
    warm = measurements / "warm_oom.json"
    if warm.exists():
        lines += ["## A real CUDA OOM in a warm process", ""]
        lines += [*_warm_oom(json.loads(warm.read_text())), ""]
    summary = measurements / "tuning_summary.txt"
    if summary.exists():
        lines += ["## Tuning run (local runner)", "", "```", summary.read_text().strip(), "```", ""]
    bench = output / "bench_engine.md"
    if bench.exists():
        lines += ["## Engine benchmark on CUDA", "", bench.read_text().strip(), ""]
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=Path, required=True, help="gpu_check.sh's steps.tsv")
    parser.add_argument("--measurements", type=Path, required=True)
    parser.add_argument("--output", type=Path, required=True)
    parser.add_argument("--dry-run", action="store_true")
    args = parser.parse_args()
    steps = _steps(args.steps)
    report = build_report(steps, args.measurements, args.output, args.dry_run)
    (args.output / "report.md").write_text(report)
    failed = [s["name"] for s in steps if s["status"] != "ok"]
    print(
        f"{len(steps) - len(failed)} of {len(steps)} steps ok"
        + (f"; failed: {failed}" if failed else "")
    )
    return 1 if failed or not steps else 0


if __name__ == "__main__":
    sys.exit(main())
