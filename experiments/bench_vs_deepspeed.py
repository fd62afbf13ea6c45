"""Head to head with DeepSpeed's autotuner: one script, one config, one space, two script shapes.

Each script trains the default gpt workload's model at world size 2, in one of two shapes:

- ``trainer``: ``experiments/ds_train_gpt.py``, shaped like a Hugging Face Trainer script
  (``--deepspeed FILE``, ``--per_device_train_batch_size``, its own DataLoader, epochs);
- ``examples``: ``experiments/ds_examples_gpt.py``, shaped like DeepSpeedExamples' scripts
  (``deepspeed.add_config_arguments``, ``init_distributed(dist_backend="gloo")`` called by the
  script, the loader built by ``initialize(training_data=...)`` at the config's micro-batch,
  ``--steps 30`` around the epochs, no ``destroy_process_group``).

Both tools get the same config: ``train_micro_batch_size_per_gpu: "auto"``, AdamW,
``autotuning`` with ``fast: true``, ``max_train_batch_size`` (CPU memory never runs out, so
something must bound the micro-batch), the profile window 3-5 (DeepSpeed's defaults) and, for
the trainer shape, the micro-batch mapped to ``--per_device_train_batch_size``. Each tool
starts from nothing in its own folder:

- ``deepspeed --autotuning run --num_gpus 2 SCRIPT ...`` (on CPU its accelerator counts devices
  from ``LOCAL_SIZE``; its launcher needs the venv's ``bin`` on ``PATH``; its results table
  needs ``tabulate``);
- ``autotune run --engine deepspeed -- SCRIPT ...``, its default search (every ZeRO stage,
  then the re-measurement race).

Each round tunes every shape with both tools on a **warm** machine (DeepSpeed's JIT-built ops,
shared memory all-reduce and fused Adam, already built in a shared ``TORCH_EXTENSIONS_DIR``,
built once before the first round) and on a **fresh** one (each run gets an empty
``TORCH_EXTENSIONS_DIR``: the ops are built by whichever tool runs, as on a new machine). The
order of the tools alternates from round to round. Then every winner (each distinct
``ds_config_optimal.json`` of a shape) trains its script on DeepSpeed, measured alike for both
(autotune's local runner on the DeepSpeed engine: fresh processes, the same window, a barrier
after each step), in interleaved rounds with the order rotating.

Prints, after each autotune run, where each of its experiments' time went (startup, warm-up,
window, teardown, and the rest: the runner's own cost, target at most 1 s); then per shape and
mode each tool's wall time and experiments per round, their ratio (target: autotune at most a
third of DeepSpeed's autotuner's; on a fresh machine also net of the ops' one-time build, as
measured alone before the warm rounds), and each round's winners on DeepSpeed (target: autotune's
at least 0.97 of DeepSpeed's); writes everything to ``results/bench_vs_deepspeed.json``.
Needs DeepSpeed (``bash install.sh deepspeed``) and a quiet machine.

    python experiments/bench_vs_deepspeed.py [--rounds 3] [--modes warm,fresh]
        [--shapes trainer,examples]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from bench_specs import timed_spec  # type: ignore[import-not-found]

from autotune.defaults import DEFAULT_CPUS_PER_RANK
from autotune.experiment import ExperimentSpec
from autotune.results import ResultsDir, load_results
from autotune.runner import LocalRunner
from autotune.runner.deepspeed_engine import EXTENSIONS_ENV, installed_deepspeed
from autotune.script_target import ScriptTarget

ROOT = Path(__file__).resolve().parents[1]
TOOLS = ("deepspeed", "autotune")
MODES = ("warm", "fresh")
WALL_SHARE_TARGET = 1 / 3  # autotune's wall over DeepSpeed's autotuner's
WINNER_TARGET = 0.97  # autotune's winner over DeepSpeed's autotuner's, trained on DeepSpeed
OTHER_TARGET_S = 1.0  # an experiment's time outside startup, warm-up, window and teardown


@dataclass(frozen=True)
class ScriptShape:
    """A training script and how it is called: where its config goes, how its micro-batch is
    set (a flag of its own, or the config's, which DeepSpeed's loader follows)."""

    name: str
    script: Path
    config_flags: tuple[str, ...]  # before the config file's path
    micro_batch_flag: str | None
    extra_args: tuple[str, ...] = ()

    def args(self, config: Path, args: argparse.Namespace) -> list[str]:
        # Enough samples that the largest batch reaches every profile window in one epoch.
        return [
            str(self.script),
            *self.config_flags,
            str(config),
            "--num_samples",
            str(args.num_samples),
            *self.extra_args,
        ]

    @property
    def arg_mappings(self) -> dict[str, str]:
        if self.micro_batch_flag is None:
            return {}
        return {"train_micro_batch_size_per_gpu": self.micro_batch_flag}


SHAPES = {
    shape.name: shape
    for shape in (
        ScriptShape(
            "trainer",
            ROOT / "experiments" / "ds_train_gpt.py",
            ("--deepspeed",),
            "--per_device_train_batch_size",
        ),
        ScriptShape(
            "examples",
            ROOT / "experiments" / "ds_examples_gpt.py",
            ("--deepspeed", "--deepspeed_config"),
            None,
            ("--steps", "30"),
        ),
    )
}


def tuning_config(shape: ScriptShape, args: argparse.Namespace) -> dict[str, Any]:
    autotuning: dict[str, Any] = {
        "enabled": True,
        "fast": True,
        "metric": "throughput",
        "max_train_batch_size": args.max_train_batch_size,
        "start_profile_step": 3,
        "end_profile_step": 5,
    }
    if shape.arg_mappings:
        autotuning["arg_mappings"] = shape.arg_mappings
    return {
        "train_micro_batch_size_per_gpu": "auto",
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
        "steps_per_print": 10**6,
        "autotuning": autotuning,
    }


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


def run_tool(
    tool: str, shape: ScriptShape, folder: Path, ops: Path, args: argparse.Namespace
) -> dict[str, Any]:
    """Tune ``shape``'s script in ``folder`` from nothing, DeepSpeed's ops built in (or into)
    ``ops``; the wall time, experiments and winning config, and for autotune where each
    experiment's time went."""
    folder.mkdir(parents=True)
    config = folder / "ds_config.json"
    config.write_text(json.dumps(tuning_config(shape, args), indent=1))
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
    command += shape.args(config, args)
    started = time.perf_counter()
    done = subprocess.run(command, cwd=folder, env=env, capture_output=True, text=True)
    wall_s = time.perf_counter() - started
    (folder / "stdout.txt").write_text(done.stdout)
    (folder / "stderr.txt").write_text(done.stderr)
    if done.returncode != 0:
        raise SystemExit(f"{tool} failed (exit {done.returncode}); see {folder}/stderr.txt")
    splits: list[dict[str, Any]] = []
    if tool == "deepspeed":
        optimal_path = folder / "autotuning_results" / "ds_config_optimal.json"
        experiments = len(list((folder / "autotuning_exps").glob("*.json")))
    else:
        optimal_path = folder / "results" / "ds_config_optimal.json"
        experiments = len(load_results(folder / "results"))
        splits = experiment_splits(folder / "results")
    optimal = json.loads(optimal_path.read_text())
    optimal.pop("autotuning", None)  # with it DeepSpeed's engine exits at its profile end
    return {
        "tool": tool,
        "wall_s": wall_s,
        "experiments": experiments,
        "optimal": optimal,
        "splits": splits,
    }


def experiment_splits(results: Path) -> list[dict[str, Any]]:
    """Where each experiment of an autotune run spent its time, in the order they finished:
    startup, warm-up, window, teardown (its ranks' own clocks), and ``other_s``, what the
    runner spent beyond them (total as the runner saw it, less the four)."""
    splits = []
    for result in ResultsDir(results).results():
        t = result.timings
        other_s = t.total_s - t.startup_s - t.warmup_s - t.window_s - t.teardown_s
        splits.append(
            {
                "name": result.name,
                "status": result.status.value,
                "startup_s": t.startup_s,
                "warmup_s": t.warmup_s,
                "window_s": t.window_s,
                "teardown_s": t.teardown_s,
                "other_s": other_s,
                "total_s": t.total_s,
            }
        )
    return splits


def print_splits(splits: Sequence[Mapping[str, Any]]) -> None:
    print(
        f"  {'experiment':16s} {'status':7s} {'startup':>8s} {'warm-up':>8s} {'window':>8s} "
        f"{'teardown':>9s} {'other':>7s} {'total':>7s}"
    )
    for split in splits:
        print(
            f"  {split['name']:16s} {split['status']:7s} {split['startup_s']:8.2f} "
            f"{split['warmup_s']:8.2f} {split['window_s']:8.2f} {split['teardown_s']:9.2f} "
            f"{split['other_s']:7.2f} {split['total_s']:7.2f}"
        )


def winner_label(config: Mapping[str, Any]) -> str:
    stage = config.get("zero_optimization", {}).get("stage", 0)
    micro = config.get("train_micro_batch_size_per_gpu")
    accumulation = config.get("gradient_accumulation_steps", 1)
    return f"ZeRO-{stage}, micro-batch {micro}, accumulation {accumulation}"


def measure_spec(
    label: str,
    shape: ScriptShape,
    optimal: Mapping[str, Any],
    args: argparse.Namespace,
    round_index: int,
) -> ExperimentSpec:
    """The winner trained on DeepSpeed: the script reads ``optimal`` in place of its config."""
    target = ScriptTarget.from_command(shape.args(Path("ds_config.json"), args), shape.arg_mappings)
    return timed_spec(
        f"winner_{shape.name}_{label}_r{round_index}",
        optimal,
        args,
        workload=None,
        workload_args={},
        script=target,
        client_config=dict(optimal),
        engine="deepspeed",
    )


def config_key(shape: str, config: Mapping[str, Any], world_size: int) -> str:
    """What a winner trains with, and which script, as one string: two configs that train
    alike (DeepSpeed's autotuner writes the batch it derived, autotune leaves it to DeepSpeed)
    are one winner, measured once a round."""
    config = dict(config)
    micro = config.get("train_micro_batch_size_per_gpu", 1)
    config.setdefault("gradient_accumulation_steps", 1)
    config.setdefault(
        "train_batch_size", micro * config["gradient_accumulation_steps"] * world_size
    )
    return f"{shape} {json.dumps(config, sort_keys=True)}"


def split_key(key: str) -> tuple[ScriptShape, dict[str, Any]]:
    shape, config = key.split(" ", 1)
    return SHAPES[shape], json.loads(config)


def tune_rounds(args: argparse.Namespace, work: Path) -> tuple[list[dict[str, Any]], float]:
    """Both tools, every shape and mode, ``args.rounds`` rounds; the runs, and the seconds
    DeepSpeed's ops took to build for the warm mode."""
    warm_ops = args.warm_ops or work / "ops-warm"
    build_s = build_ops(warm_ops, args.world_size) if "warm" in args.modes else 0.0
    runs = []
    for round_index in range(args.rounds):
        for mode in args.modes:
            for shape_name in args.shapes:
                order = TOOLS if round_index % 2 == 0 else TOOLS[::-1]
                for tool in order:
                    name = f"{shape_name}-{mode}-r{round_index}-{tool}"
                    ops = warm_ops if mode == "warm" else work / f"ops-{name}"
                    run = {"shape": shape_name, "mode": mode, "round": round_index}
                    run.update(run_tool(tool, SHAPES[shape_name], work / name, ops, args))
                    runs.append(run)
                    print(
                        f"{name:32s} {run['wall_s']:6.1f} s, {run['experiments']:2d} "
                        f"experiments; winner {winner_label(run['optimal'])}",
                        flush=True,
                    )
                    if run["splits"]:
                        print_splits(run["splits"])
    return runs, build_s


def measure_winners(runs: Sequence[Mapping[str, Any]], args: argparse.Namespace) -> dict[str, Any]:
    """Every distinct winner trained on DeepSpeed in ``args.measure_rounds`` interleaved
    rounds, the order rotating; samples/s by the winner's key (its shape and config)."""
    distinct = list(
        dict.fromkeys(
            config_key(run.get("shape", "trainer"), run["optimal"], args.world_size) for run in runs
        )
    )
    runner = LocalRunner()
    samples: dict[str, list[float]] = {key: [] for key in distinct}
    for round_index in range(args.measure_rounds):
        shift = round_index % len(distinct)
        for index, key in enumerate(distinct[shift:] + distinct[:shift]):
            shape, config = split_key(key)
            result = runner.run(measure_spec(f"{index}", shape, config, args, round_index))
            if not result.ok or result.metrics is None:
                raise SystemExit(
                    f"winner {winner_label(config)} of {shape.name} failed on DeepSpeed: "
                    f"{result.error}"
                )
            samples[key].append(result.metrics.throughput)
            print(
                f"round {round_index} {shape.name} {winner_label(config)}: "
                f"{samples[key][-1]:.1f} samples/s"
            )
    return samples


def paired_ratio(samples: Mapping[str, Sequence[float]], mine: str, theirs: str) -> float:
    """``mine`` over ``theirs``, round by round (both trained in each round, close in time,
    so the machine's drift between rounds cancels), the median of the rounds."""
    return statistics.median(a / b for a, b in zip(samples[mine], samples[theirs], strict=True))


def paired_runs(
    runs: Sequence[Mapping[str, Any]], shape: str, mode: str
) -> dict[int, dict[str, Mapping[str, Any]]]:
    """By round, each tool's run of ``shape`` in ``mode``."""
    by_round: dict[int, dict[str, Mapping[str, Any]]] = {}
    for run in runs:
        if run.get("shape", "trainer") == shape and run["mode"] == mode:
            by_round.setdefault(run["round"], {})[run["tool"]] = run
    return by_round


def summarize(
    runs: Sequence[Mapping[str, Any]],
    samples: Mapping[str, Sequence[float]],
    args: argparse.Namespace,
    build_s: float | None = None,
) -> dict[str, Any]:
    """Per shape and mode: the wall-time shares and winner ratios tuning round by tuning
    round, their medians, and the most any of autotune's experiments spent outside startup,
    warm-up, window and teardown. On a fresh machine the shares net of the one-time build of
    DeepSpeed's ops too (``build_s``, as measured alone before the warm rounds; None: not
    measured), which both tools pay within their run."""
    summary: dict[str, Any] = {}
    for shape in args.shapes:
        for mode in args.modes:
            by_round = paired_runs(runs, shape, mode)
            rounds = list(by_round.values())
            shares = [r["autotune"]["wall_s"] / r["deepspeed"]["wall_s"] for r in rounds]
            ratios = [
                paired_ratio(
                    samples,
                    config_key(shape, r["autotune"]["optimal"], args.world_size),
                    config_key(shape, r["deepspeed"]["optimal"], args.world_size),
                )
                for r in rounds
            ]
            others = [s["other_s"] for r in rounds for s in r["autotune"].get("splits", [])]
            net = (
                [
                    (r["autotune"]["wall_s"] - build_s) / (r["deepspeed"]["wall_s"] - build_s)
                    for r in rounds
                ]
                if mode == "fresh" and build_s
                else None
            )
            summary[f"{shape}/{mode}"] = {
                "wall_s": {tool: [r[tool]["wall_s"] for r in rounds] for tool in TOOLS},
                "experiments": {tool: [r[tool]["experiments"] for r in rounds] for tool in TOOLS},
                "wall_share": shares,
                "wall_share_median": statistics.median(shares),
                "wall_share_net_of_build": net,
                "winner_ratio": ratios,
                "winner_ratio_median": statistics.median(ratios),
                "winner_ratio_min": min(ratios),
                "other_s_max": max(others) if others else None,
            }
    return summary


def print_table(
    runs: Sequence[Mapping[str, Any]],
    samples: Mapping[str, Sequence[float]],
    args: argparse.Namespace,
) -> None:
    print(
        "| script | machine | round | DeepSpeed's autotuner: s (experiments) "
        "| autotune: s (experiments) | wall share "
        "| winners on DeepSpeed, median samples/s: DeepSpeed's / autotune's "
        "| ratio, paired by round |"
    )
    print("|---|---|---|---|---|---|---|---|")
    value = {key: statistics.median(values) for key, values in samples.items()}
    for shape in args.shapes:
        for mode in args.modes:
            for round_index, pair in sorted(paired_runs(runs, shape, mode).items()):
                ds, at = pair["deepspeed"], pair["autotune"]
                ds_key = config_key(shape, ds["optimal"], args.world_size)
                at_key = config_key(shape, at["optimal"], args.world_size)
                print(
                    f"| {shape} | {mode} | {round_index} | {ds['wall_s']:.0f} "
                    f"({ds['experiments']}) | {at['wall_s']:.0f} ({at['experiments']}) | "
                    f"{at['wall_s'] / ds['wall_s']:.2f} | "
                    f"{winner_label(ds['optimal'])} {value[ds_key]:.1f} / "
                    f"{winner_label(at['optimal'])} {value[at_key]:.1f} | "
                    f"{paired_ratio(samples, at_key, ds_key):.3f} |"
                )


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
    parser.add_argument(
        "--shapes", default=",".join(SHAPES), help=f"script shapes: {', '.join(SHAPES)}"
    )
    parser.add_argument(
        "--warm-ops",
        type=Path,
        help="the warm runs' TORCH_EXTENSIONS_DIR, its ops built already (default: a new "
        "folder, built before the first round)",
    )
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
    args.shapes = [shape for shape in SHAPES if shape in args.shapes.split(",")]
    if not args.shapes:
        raise SystemExit(f"--shapes: one or more of {', '.join(SHAPES)}")
    version = installed_deepspeed()
    for tool in TOOLS:
        if shutil.which(tool, path=str(Path(sys.executable).parent)) is None:
            raise SystemExit(f"`{tool}` is not in this venv's bin: bash install.sh deepspeed")
    if importlib.util.find_spec("tabulate") is None:
        raise SystemExit(
            "DeepSpeed's autotuner prints its results with tabulate: bash install.sh deepspeed"
        )

    work: Path | None = None  # the tuners' folders, where this run tunes
    if args.winners_from is not None:
        try:
            earlier = json.loads(args.winners_from.read_text())
        except (OSError, json.JSONDecodeError) as err:
            raise SystemExit(f"--winners-from {args.winners_from}: {err}") from None
        runs, build_s = earlier["runs"], earlier["ops_build_s"]
        how = earlier["how"]
        args.rounds, args.modes = how["rounds"], how["modes"]
        args.shapes = how.get("shapes", ["trainer"])
    else:
        work = Path(tempfile.mkdtemp(prefix="bench_vs_deepspeed_"))
        runs, build_s = tune_rounds(args, work)
    if args.winners_from is not None and args.measure_rounds == 0:  # its table again
        samples = earlier["winner_samples_per_s"]
        args.measure_rounds = len(next(iter(samples.values())))
    else:
        samples = measure_winners(runs, args)
    summary = summarize(runs, samples, args, build_s)

    print(
        f"\nDeepSpeed {version}, world size {args.world_size}, {args.rounds} tuning rounds, "
        f"winners trained in {args.measure_rounds} rounds"
    )
    if "warm" in args.modes:
        print(f"DeepSpeed's ops built once for the warm runs in {build_s:.0f} s")
    print_table(runs, samples, args)
    for key, figures in summary.items():
        other = figures["other_s_max"]
        print(
            f"{key}: autotune's wall / DeepSpeed's autotuner's, median "
            f"{figures['wall_share_median']:.2f} (target <= {WALL_SHARE_TARGET:.2f}); "
            f"winner ratio median {figures['winner_ratio_median']:.3f}, at worst "
            f"{figures['winner_ratio_min']:.3f} (target >= {WINNER_TARGET}); an experiment's "
            "time outside startup, warm-up, window and teardown at most "
            + (f"{other:.2f} s" if other is not None else "unknown")
            + f" (target <= {OTHER_TARGET_S:.0f} s)"
        )
        if figures["wall_share_net_of_build"]:
            net = ", ".join(f"{share:.2f}" for share in figures["wall_share_net_of_build"])
            print(f"{key}: the wall share net of the ops' build ({build_s:.0f} s), by round: {net}")
    noise = max((max(v) - min(v)) / 2 / statistics.median(v) for v in samples.values())
    print(f"winners' spread between training rounds: +-{noise:.3f}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    record = {
        "how": {
            "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "machine": f"{platform.machine()}, {os.cpu_count()} cores",
            "load_before": os.getloadavg()[0],
            "deepspeed": version,
            "world_size": args.world_size,
            "configs": {shape: tuning_config(SHAPES[shape], args) for shape in args.shapes},
            "scripts": {
                shape: shlex.join(SHAPES[shape].args(Path("ds_config.json"), args))
                for shape in args.shapes
            },
            "rounds": args.rounds,
            "measure_rounds": args.measure_rounds,
            "modes": args.modes,
            "shapes": args.shapes,
            "measure_profile_steps": [args.start_profile_step, args.end_profile_step],
        },
        "ops_build_s": build_s,
        "runs": runs,
        "winner_samples_per_s": {key: list(values) for key, values in samples.items()},
        "winner_noise": noise,
        "summary": summary,
    }
    args.out.write_text(json.dumps(record, indent=1) + "\n")
    print(f"wrote {args.out}" + (f" (the tuners' folders: {work})" if work else ""))


if __name__ == "__main__":
    main()
