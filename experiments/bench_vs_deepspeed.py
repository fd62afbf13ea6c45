"""Head to head with DeepSpeed's autotuner: one script, one config, one space.

The script is ``experiments/ds_train_gpt.py`` (the default gpt workload's model trained the way
a DeepSpeed user's script trains it), at world size 2. Both tools get the same config:
``train_micro_batch_size_per_gpu: "auto"``, AdamW, ``autotuning`` with ``fast: true``,
``max_train_batch_size`` (CPU memory never runs out, so something must bound the
micro-batch), the profile window 3-5 (DeepSpeed's defaults) and the micro-batch mapped to the
script's ``--per_device_train_batch_size``. Each tool starts from nothing in its own folder:

- ``deepspeed --autotuning run --num_gpus 2 ds_train_gpt.py --deepspeed ds_config.json``
  (on CPU its accelerator counts devices from ``LOCAL_SIZE``; its launcher needs the venv's
  ``bin`` on ``PATH``; its results table needs ``tabulate``);
- ``autotune run --engine deepspeed -- ds_train_gpt.py --deepspeed ds_config.json``, its
  default search (every ZeRO stage, then the re-measurement race);
- the same with ``autotuning.time_budget_s`` a third of DeepSpeed's wall time: what a user
  who wants the answer in that time gets.

Then each tool's ``ds_config_optimal.json`` trains the same script on DeepSpeed, measured
alike for both (autotune's local runner on the DeepSpeed engine: fresh processes, the same
window, a barrier after each step), in interleaved rounds with the order alternating.

Prints wall time, experiments run and the winner of each tool, the winners' samples/s on
DeepSpeed (median and spread over the rounds), and the ratios; writes everything to
``results/bench_vs_deepspeed.json``. Needs DeepSpeed (``bash install.sh deepspeed``).

    python experiments/bench_vs_deepspeed.py [--rounds 5] [--max-train-batch-size 64]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from bench_specs import timed_spec  # type: ignore[import-not-found]

from autotune.defaults import DEFAULT_CPUS_PER_RANK
from autotune.experiment import ExperimentSpec
from autotune.results import load_results
from autotune.runner import LocalRunner
from autotune.runner.deepspeed_engine import installed_deepspeed
from autotune.script_target import ScriptTarget

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "experiments" / "ds_train_gpt.py"
MICRO_BATCH_FLAG = "--per_device_train_batch_size"
TOOLS = ("deepspeed", "autotune", "autotune_budget")


def tuning_config(args: argparse.Namespace) -> dict[str, Any]:
    return {
        "train_micro_batch_size_per_gpu": "auto",
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
        "steps_per_print": 10**6,
        "autotuning": {
            "enabled": True,
            "fast": True,
            "metric": "throughput",
            "max_train_batch_size": args.max_train_batch_size,
            "start_profile_step": 3,
            "end_profile_step": 5,
            "arg_mappings": {"train_micro_batch_size_per_gpu": MICRO_BATCH_FLAG},
        },
    }


def script_args(config: Path, args: argparse.Namespace) -> list[str]:
    # Enough samples that the largest batch reaches every profile window in one epoch.
    return [str(SCRIPT), "--deepspeed", str(config), "--num_samples", str(args.num_samples)]


def run_tool(
    tool: str, folder: Path, args: argparse.Namespace, time_budget_s: float | None = None
) -> dict[str, Any]:
    """Tune in ``folder`` from nothing; the wall time, experiments and winning config."""
    folder.mkdir(parents=True)
    config = folder / "ds_config.json"
    settings = tuning_config(args)
    if time_budget_s is not None:
        settings["autotuning"]["time_budget_s"] = time_budget_s
    config.write_text(json.dumps(settings, indent=1))
    bin_dir = str(Path(sys.executable).parent)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ.get('PATH', '')}"}
    if tool == "deepspeed":
        # As autotune does for its ranks: one thread per rank on a shared machine, and
        # DeepSpeed's CPU accelerator told how many "devices" the node has.
        env.update(LOCAL_SIZE=str(args.world_size), OMP_NUM_THREADS=str(DEFAULT_CPUS_PER_RANK))
        command = ["deepspeed", "--autotuning", "run", "--num_gpus", str(args.world_size)]
    else:
        results = folder / "results"
        command = ["autotune", "run", "--engine", "deepspeed", "--results-dir", str(results)]
        command += ["--world-size", str(args.world_size), "-q", "--"]
    command += script_args(config, args)
    started = time.perf_counter()
    done = subprocess.run(command, cwd=folder, env=env, capture_output=True, text=True)
    wall_s = time.perf_counter() - started
    (folder / "stdout.txt").write_text(done.stdout)
    (folder / "stderr.txt").write_text(done.stderr)
    if done.returncode != 0:
        raise SystemExit(f"{tool} failed (exit {done.returncode}); see {folder}/stderr.txt")
    if tool == "deepspeed":
        optimal_path = folder / "autotuning_results" / "ds_config_optimal.json"
        experiments = len(list((folder / "autotuning_exps").glob("*.json")))
    else:
        optimal_path = folder / "results" / "ds_config_optimal.json"
        experiments = len(load_results(folder / "results"))
    optimal = json.loads(optimal_path.read_text())
    optimal.pop("autotuning", None)  # with it DeepSpeed's engine exits at its profile end
    return {"wall_s": wall_s, "experiments": experiments, "optimal": optimal}


def winner_label(config: Mapping[str, Any]) -> str:
    stage = config.get("zero_optimization", {}).get("stage", 0)
    micro = config.get("train_micro_batch_size_per_gpu")
    accumulation = config.get("gradient_accumulation_steps", 1)
    return f"ZeRO-{stage}, micro-batch {micro}, accumulation {accumulation}"


def measure_spec(
    tool: str, optimal: Mapping[str, Any], args: argparse.Namespace, round_index: int
) -> ExperimentSpec:
    """The winner trained on DeepSpeed: the script reads ``optimal`` in place of its config."""
    target = ScriptTarget.from_command(
        script_args(Path("ds_config.json"), args),
        {"train_micro_batch_size_per_gpu": MICRO_BATCH_FLAG},
    )
    return timed_spec(
        f"{tool}_winner_r{round_index}",
        optimal,
        args,
        workload=None,
        workload_args={},
        script=target,
        client_config=dict(optimal),
        engine="deepspeed",
    )


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--max-train-batch-size", type=int, default=64)
    parser.add_argument("--num-samples", type=int, default=2048)
    parser.add_argument("--start-profile-step", type=int, default=3)
    parser.add_argument("--end-profile-step", type=int, default=12)
    parser.add_argument("--world-size", type=int, default=2)
    parser.add_argument("--out", type=Path, default=ROOT / "results" / "bench_vs_deepspeed.json")
    args = parser.parse_args(argv)
    version = installed_deepspeed()
    for tool in ("deepspeed", "autotune"):
        if shutil.which(tool, path=str(Path(sys.executable).parent)) is None:
            raise SystemExit(f"`{tool}` is not in this venv's bin: bash install.sh deepspeed")
    if importlib.util.find_spec("tabulate") is None:
        raise SystemExit(
            "DeepSpeed's autotuner prints its results with tabulate: bash install.sh deepspeed"
        )

    work = Path(tempfile.mkdtemp(prefix="bench_vs_deepspeed_"))
    tuned = {tool: run_tool(tool, work / tool, args) for tool in ("deepspeed", "autotune")}
    budget_s = tuned["deepspeed"]["wall_s"] / 3
    tuned["autotune_budget"] = run_tool("autotune", work / "autotune_budget", args, budget_s)
    for tool in TOOLS:
        print(
            f"{tool:9s} tuned in {tuned[tool]['wall_s']:.0f} s, "
            f"{tuned[tool]['experiments']} experiments; winner "
            f"{winner_label(tuned[tool]['optimal'])}",
            flush=True,
        )

    runner = LocalRunner()
    samples: dict[str, list[float]] = {tool: [] for tool in TOOLS}
    for round_index in range(args.rounds):
        order = TOOLS[round_index % len(TOOLS) :] + TOOLS[: round_index % len(TOOLS)]
        for tool in order:
            result = runner.run(measure_spec(tool, tuned[tool]["optimal"], args, round_index))
            if not result.ok or result.metrics is None:
                raise SystemExit(f"{tool}'s winner failed on DeepSpeed: {result.error}")
            samples[tool].append(result.metrics.throughput)
            print(f"round {round_index} {tool:9s} winner {samples[tool][-1]:.1f} samples/s")

    median = {tool: statistics.median(samples[tool]) for tool in TOOLS}
    # Noise: the spread of one winner's rounds around its median, the largest of them.
    noise = max((max(samples[t]) - min(samples[t])) / 2 / median[t] for t in TOOLS)
    ratio = {t: median[t] / median["deepspeed"] for t in TOOLS[1:]}
    time_share = {t: tuned[t]["wall_s"] / tuned["deepspeed"]["wall_s"] for t in TOOLS[1:]}
    print(f"\nDeepSpeed {version}, world size {args.world_size}, {args.rounds} rounds")
    print("| tuner | wall time (s) | experiments | winner | winner on DeepSpeed (samples/s) |")
    print("|---|---|---|---|---|")
    for tool in TOOLS:
        print(
            f"| {tool} | {tuned[tool]['wall_s']:.0f} | {tuned[tool]['experiments']} | "
            f"{winner_label(tuned[tool]['optimal'])} | {median[tool]:.1f} "
            f"({min(samples[tool]):.1f}-{max(samples[tool]):.1f}) |"
        )
    for tool in TOOLS[1:]:
        print(
            f"{tool}: winner / DeepSpeed's {ratio[tool]:.3f} (noise +-{noise:.3f}), "
            f"wall time / DeepSpeed's {time_share[tool]:.2f}"
        )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    record = {
        "how": {
            "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "machine": f"{platform.machine()}, {os.cpu_count()} cores",
            "deepspeed": version,
            "world_size": args.world_size,
            "config": tuning_config(args),
            "rounds": args.rounds,
            "measure_profile_steps": [args.start_profile_step, args.end_profile_step],
        },
        "tuned": tuned,
        "winner_samples_per_s": samples,
        "summary": {
            "winner_ratio": ratio,
            "noise": noise,
            "wall_time_share": time_share,
        },
    }
    args.out.write_text(json.dumps(record, indent=1) + "\n")
    print(f"wrote {args.out} (the tuners' folders: {work})")


if __name__ == "__main__":
    main()
