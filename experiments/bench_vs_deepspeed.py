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
  default search (every ZeRO stage, then the re-measurement race).

Each round tunes with both tools on a **warm** machine (DeepSpeed's JIT-built ops, shared
memory all-reduce and fused Adam, already built in a shared ``TORCH_EXTENSIONS_DIR``, built
once before the first round) and on a **fresh** one (each run gets an empty
``TORCH_EXTENSIONS_DIR``: the ops are built by whichever tool runs, as on a new machine). The
order of the tools alternates from round to round. Then every winner (each distinct
``ds_config_optimal.json``) trains the same script on DeepSpeed, measured alike for both
(autotune's local runner on the DeepSpeed engine: fresh processes, the same window, a barrier
after each step), in interleaved rounds with the order rotating.

Prints, per mode, each tool's wall time and experiments per round, their ratio (target: autotune
at most a third of DeepSpeed's autotuner's), and each round's winners on DeepSpeed (target:
autotune's at least 0.97 of DeepSpeed's); writes everything to
``results/bench_vs_deepspeed.json``. Needs DeepSpeed (``bash install.sh deepspeed``) and a quiet
machine.

    python experiments/bench_vs_deepspeed.py [--rounds 3] [--modes warm,fresh]
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
from autotune.runner.deepspeed_engine import EXTENSIONS_ENV, installed_deepspeed
from autotune.script_target import ScriptTarget

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "experiments" / "ds_train_gpt.py"
MICRO_BATCH_FLAG = "--per_device_train_batch_size"
TOOLS = ("deepspeed", "autotune")
MODES = ("warm", "fresh")
WALL_SHARE_TARGET = 1 / 3  # autotune's wall over DeepSpeed's autotuner's
WINNER_TARGET = 0.97  # autotune's winner over DeepSpeed's autotuner's, trained on DeepSpeed


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


def tool_env(ops: Path) -> dict[str, str]:
    """The environment both tools run in: the venv's ``bin`` on ``PATH`` (DeepSpeed's launcher
    starts ``python`` and ``deepspeed`` from there) and DeepSpeed's ops built in ``ops``."""
    bin_dir = str(Path(sys.executable).parent)
    path = f"{bin_dir}:{os.environ.get('PATH', '')}"
    return {**os.environ, "PATH": path, EXTENSIONS_ENV: str(ops)}


def build_ops(ops: Path, world_size: int) -> float:
    """Build DeepSpeed's CPU ops in ``ops`` as a first experiment would; the seconds it took
    (what a fresh machine pays once, whichever tool runs first)."""
    started = time.perf_counter()
    code = f"from autotune.runner.deepspeed_engine import prepare; prepare({world_size})"
    subprocess.run([sys.executable, "-c", code], env=tool_env(ops), check=True)
    return time.perf_counter() - started


def run_tool(tool: str, folder: Path, ops: Path, args: argparse.Namespace) -> dict[str, Any]:
    """Tune in ``folder`` from nothing, DeepSpeed's ops built in (or into) ``ops``; the wall
    time, experiments and winning config."""
    folder.mkdir(parents=True)
    config = folder / "ds_config.json"
    config.write_text(json.dumps(tuning_config(args), indent=1))
    env = tool_env(ops)
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
    return {"tool": tool, "wall_s": wall_s, "experiments": experiments, "optimal": optimal}


def winner_label(config: Mapping[str, Any]) -> str:
    stage = config.get("zero_optimization", {}).get("stage", 0)
    micro = config.get("train_micro_batch_size_per_gpu")
    accumulation = config.get("gradient_accumulation_steps", 1)
    return f"ZeRO-{stage}, micro-batch {micro}, accumulation {accumulation}"


def measure_spec(
    label: str, optimal: Mapping[str, Any], args: argparse.Namespace, round_index: int
) -> ExperimentSpec:
    """The winner trained on DeepSpeed: the script reads ``optimal`` in place of its config."""
    target = ScriptTarget.from_command(
        script_args(Path("ds_config.json"), args),
        {"train_micro_batch_size_per_gpu": MICRO_BATCH_FLAG},
    )
    return timed_spec(
        f"winner_{label}_r{round_index}",
        optimal,
        args,
        workload=None,
        workload_args={},
        script=target,
        client_config=dict(optimal),
        engine="deepspeed",
    )


def config_key(config: Mapping[str, Any], world_size: int) -> str:
    """What a winner trains with, as one string: two configs that train alike (DeepSpeed's
    autotuner writes the batch it derived, autotune leaves it to DeepSpeed) are one winner,
    measured once a round."""
    config = dict(config)
    micro = config.get("train_micro_batch_size_per_gpu", 1)
    config.setdefault("gradient_accumulation_steps", 1)
    config.setdefault(
        "train_batch_size", micro * config["gradient_accumulation_steps"] * world_size
    )
    return json.dumps(config, sort_keys=True)


def tune_rounds(args: argparse.Namespace, work: Path) -> tuple[list[dict[str, Any]], float]:
    """Both tools, every mode, ``args.rounds`` rounds; the runs, and the seconds DeepSpeed's
    ops took to build for the warm mode."""
    warm_ops = work / "ops-warm"
    build_s = build_ops(warm_ops, args.world_size) if "warm" in args.modes else 0.0
    runs = []
    for round_index in range(args.rounds):
        for mode in args.modes:
            order = TOOLS if round_index % 2 == 0 else TOOLS[::-1]
            for tool in order:
                name = f"{mode}-r{round_index}-{tool}"
                ops = warm_ops if mode == "warm" else work / f"ops-{name}"
                run = {"mode": mode, "round": round_index}
                run.update(run_tool(tool, work / name, ops, args))
                runs.append(run)
                print(
                    f"{name:22s} {run['wall_s']:6.1f} s, {run['experiments']:2d} experiments; "
                    f"winner {winner_label(run['optimal'])}",
                    flush=True,
                )
    return runs, build_s


def measure_winners(runs: Sequence[Mapping[str, Any]], args: argparse.Namespace) -> dict[str, Any]:
    """Every distinct winner trained on DeepSpeed in ``args.measure_rounds`` interleaved
    rounds, the order rotating; samples/s by the winner's config key."""
    distinct = list(dict.fromkeys(config_key(run["optimal"], args.world_size) for run in runs))
    runner = LocalRunner()
    samples: dict[str, list[float]] = {key: [] for key in distinct}
    for round_index in range(args.measure_rounds):
        shift = round_index % len(distinct)
        for index, key in enumerate(distinct[shift:] + distinct[:shift]):
            config = json.loads(key)
            result = runner.run(measure_spec(f"{index}", config, args, round_index))
            if not result.ok or result.metrics is None:
                raise SystemExit(
                    f"winner {winner_label(config)} failed on DeepSpeed: {result.error}"
                )
            samples[key].append(result.metrics.throughput)
            print(f"round {round_index} {winner_label(config)}: {samples[key][-1]:.1f} samples/s")
    return samples


def paired_ratio(samples: Mapping[str, Sequence[float]], mine: str, theirs: str) -> float:
    """``mine`` over ``theirs``, round by round (both trained in each round, close in time,
    so the machine's drift between rounds cancels), the median of the rounds."""
    return statistics.median(a / b for a, b in zip(samples[mine], samples[theirs], strict=True))


def summarize(
    runs: Sequence[Mapping[str, Any]],
    samples: Mapping[str, Sequence[float]],
    modes: Sequence[str],
    world_size: int,
) -> dict[str, Any]:
    """Per mode: the wall-time shares and winner ratios tuning round by tuning round, and
    their medians."""
    summary: dict[str, Any] = {}
    for mode in modes:
        by_round: dict[int, dict[str, Mapping[str, Any]]] = {}
        for run in runs:
            if run["mode"] == mode:
                by_round.setdefault(run["round"], {})[run["tool"]] = run
        shares = [r["autotune"]["wall_s"] / r["deepspeed"]["wall_s"] for r in by_round.values()]
        ratios = [
            paired_ratio(
                samples,
                config_key(r["autotune"]["optimal"], world_size),
                config_key(r["deepspeed"]["optimal"], world_size),
            )
            for r in by_round.values()
        ]
        summary[mode] = {
            "wall_s": {tool: [r[tool]["wall_s"] for r in by_round.values()] for tool in TOOLS},
            "experiments": {
                tool: [r[tool]["experiments"] for r in by_round.values()] for tool in TOOLS
            },
            "wall_share": shares,
            "wall_share_median": statistics.median(shares),
            "winner_ratio": ratios,
            "winner_ratio_median": statistics.median(ratios),
            "winner_ratio_min": min(ratios),
        }
    return summary


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3, help="tuning rounds")
    parser.add_argument(
        "--measure-rounds", type=int, default=7, help="rounds training the winners on DeepSpeed"
    )
    parser.add_argument(
        "--winners-from",
        type=Path,
        help="a record this script wrote: train its winners again, without tuning again",
    )
    parser.add_argument("--modes", default=",".join(MODES), help="warm, fresh or both")
    parser.add_argument("--max-train-batch-size", type=int, default=64)
    parser.add_argument("--num-samples", type=int, default=2048)
    parser.add_argument("--start-profile-step", type=int, default=3)
    parser.add_argument("--end-profile-step", type=int, default=12)
    parser.add_argument("--world-size", type=int, default=2)
    parser.add_argument("--out", type=Path, default=ROOT / "results" / "bench_vs_deepspeed.json")
    args = parser.parse_args(argv)
    args.modes = [mode for mode in MODES if mode in args.modes.split(",")]
    if not args.modes:
        raise SystemExit(f"--modes: one or both of {', '.join(MODES)}")
    version = installed_deepspeed()
    for tool in TOOLS:
        if shutil.which(tool, path=str(Path(sys.executable).parent)) is None:
            raise SystemExit(f"`{tool}` is not in this venv's bin: bash install.sh deepspeed")
    if importlib.util.find_spec("tabulate") is None:
        raise SystemExit(
            "DeepSpeed's autotuner prints its results with tabulate: bash install.sh deepspeed"
        )

    work = Path(tempfile.mkdtemp(prefix="bench_vs_deepspeed_"))
    if args.winners_from is not None:
        earlier = json.loads(args.winners_from.read_text())
        runs, build_s = earlier["runs"], earlier["ops_build_s"]
        args.rounds, args.modes = earlier["how"]["rounds"], earlier["how"]["modes"]
    else:
        runs, build_s = tune_rounds(args, work)
    if args.winners_from is not None and args.measure_rounds == 0:  # its table again
        samples = earlier["winner_samples_per_s"]
        args.measure_rounds = len(next(iter(samples.values())))
    else:
        samples = measure_winners(runs, args)
    summary = summarize(runs, samples, args.modes, args.world_size)

    print(
        f"\nDeepSpeed {version}, world size {args.world_size}, {args.rounds} tuning rounds, "
        f"winners trained in {args.measure_rounds} rounds"
    )
    if "warm" in args.modes:
        print(f"DeepSpeed's ops built once for the warm runs in {build_s:.0f} s")
    print(
        "| machine | round | DeepSpeed's autotuner: s (experiments) | autotune: s (experiments) "
        "| wall share | winners on DeepSpeed, median samples/s: DeepSpeed's / autotune's "
        "| ratio, paired by round |"
    )
    print("|---|---|---|---|---|---|---|")
    value = {key: statistics.median(values) for key, values in samples.items()}
    for mode in args.modes:
        for round_index in range(args.rounds):
            pair = {r["tool"]: r for r in runs if r["mode"] == mode and r["round"] == round_index}
            ds, at = pair["deepspeed"], pair["autotune"]
            ds_key = config_key(ds["optimal"], args.world_size)
            at_key = config_key(at["optimal"], args.world_size)
            ds_value, at_value = value[ds_key], value[at_key]
            print(
                f"| {mode} | {round_index} | {ds['wall_s']:.0f} ({ds['experiments']}) | "
                f"{at['wall_s']:.0f} ({at['experiments']}) | {at['wall_s'] / ds['wall_s']:.2f} | "
                f"{winner_label(ds['optimal'])} {ds_value:.1f} / "
                f"{winner_label(at['optimal'])} {at_value:.1f} | "
                f"{paired_ratio(samples, at_key, ds_key):.3f} |"
            )
    for mode in args.modes:
        figures = summary[mode]
        print(
            f"{mode}: autotune's wall / DeepSpeed's autotuner's, median "
            f"{figures['wall_share_median']:.2f} (target <= {WALL_SHARE_TARGET:.2f}); "
            f"winner ratio median {figures['winner_ratio_median']:.3f}, at worst "
            f"{figures['winner_ratio_min']:.3f} (target >= {WINNER_TARGET})"
        )
    noise = max((max(v) - min(v)) / 2 / statistics.median(v) for v in samples.values())
    print(f"winners' spread between training rounds: +-{noise:.3f}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    record = {
        "how": {
            "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "machine": f"{platform.machine()}, {os.cpu_count()} cores",
            "deepspeed": version,
            "world_size": args.world_size,
            "config": tuning_config(args),
            "rounds": args.rounds,
            "measure_rounds": args.measure_rounds,
            "modes": args.modes,
            "measure_profile_steps": [args.start_profile_step, args.end_profile_step],
        },
        "ops_build_s": build_s,
        "runs": runs,
        "winner_samples_per_s": {key: list(values) for key, values in samples.items()},
        "winner_noise": noise,
        "summary": summary,
    }
    args.out.write_text(json.dumps(record, indent=1) + "\n")
    print(f"wrote {args.out} (the tuners' folders: {work})")


if __name__ == "__main__":
    main()
