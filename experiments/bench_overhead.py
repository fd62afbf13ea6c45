"""Per-experiment overhead: warm Ray actors vs a fresh ``torchrun`` launch per experiment.

Overhead = an experiment's wall time (launch to verdict, as its runner sees it) minus the time
spent inside its warm-up and profile window (``Timings.overhead_s``): process start-up, the
torch import, the process group, building the workload and engine, and tear-down. DeepSpeed's
autotuner pays a fresh launch per experiment; autotune keeps its rank processes warm.

Both runners run the same experiment (the default ``gpt`` workload at world size 2),
alternately, so that load from anything else on the machine falls on both alike.

``--mode script`` measures script mode instead: each experiment runs a DeepSpeed-style
training script (``experiments/ds_train_gpt.py``, the same gpt model) through ``runpy`` in the
rank processes, as ``autotune run -- script.py`` does; the fresh peer is then what DeepSpeed's
autotuner does per experiment, a fresh ``torchrun`` of the script. Overhead there also holds
what the script does before ``initialize()`` (imports, model, dataset).

    python experiments/bench_overhead.py [--experiments 10] [--mode script]

Prints a table and writes every figure to ``results/bench_overhead.json`` (script mode:
``results/bench_overhead_script.json``). Targets: median overhead with warm actors <= 1.0 s
(issue 5; script mode <= 1.5 s, issue 12), and >= 5x less than fresh launches.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

from autotune.config import AutotuningConfig
from autotune.defaults import DEFAULT_CPUS_PER_RANK, DEFAULT_WORKLOAD, DEFAULT_WORLD_SIZE
from autotune.experiment import ExperimentResult, ExperimentSpec, Status
from autotune.runner import combine_outcomes, free_port, run_rank
from autotune.runner.outcome import RankOutcome
from autotune.runner.process import utc_now
from autotune.script_target import ScriptTarget

ROOT = Path(__file__).resolve().parents[1]
RESULTS = {
    "workload": ROOT / "results" / "bench_overhead.json",
    "script": ROOT / "results" / "bench_overhead_script.json",
}
TARGET_WARM_OVERHEAD_S = {"workload": 1.0, "script": 1.5}
TARGET_RATIO = 5.0
SCRIPT = ROOT / "experiments" / "ds_train_gpt.py"
DS_CONFIG = {
    "train_batch_size": 8,
    "train_micro_batch_size_per_gpu": 4,
    "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
    "zero_optimization": {"stage": 2},
}


def benchmark_spec(name: str, mode: str = "workload", folder: Path | None = None) -> ExperimentSpec:
    """The default gpt workload (or the script training it), ZeRO-2, world size 2, the
    default profile window. Script mode writes the script's config and output in ``folder``."""
    tuning = AutotuningConfig()  # DeepSpeed's defaults: profile window, timeout, seed
    job = {
        "ds_config": DS_CONFIG,
        "world_size": DEFAULT_WORLD_SIZE,
        "start_profile_step": tuning.start_profile_step,
        "end_profile_step": tuning.end_profile_step,
        "timeout_s": tuning.timeout_s,
        "seed": tuning.seed,
        "cpus_per_rank": DEFAULT_CPUS_PER_RANK,
    }
    if mode == "workload":
        return ExperimentSpec(name=name, workload=DEFAULT_WORKLOAD, workload_args={}, **job)
    folder = folder or Path(tempfile.mkdtemp(prefix="bench-script-"))
    config_path = folder / "ds_config.json"
    config_path.write_text(json.dumps(DS_CONFIG))
    script = ScriptTarget.from_command(
        [str(SCRIPT), "--deepspeed", str(config_path)],
        {"train_micro_batch_size_per_gpu": "--per_device_train_batch_size"},
    )
    return ExperimentSpec(
        name=name,
        workload=None,
        workload_args={},
        script=script,
        output_dir=str(folder / name),
        **job,
    )


def run_torchrun(spec: ExperimentSpec) -> ExperimentResult:
    """One experiment as DeepSpeed's autotuner runs it: a fresh ``torchrun`` job."""
    with tempfile.TemporaryDirectory(prefix="bench-torchrun-") as folder:
        spec_path = Path(folder) / "spec.json"
        spec_path.write_text(json.dumps(spec.to_dict()))
        command = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            f"--nproc_per_node={spec.world_size}",
            f"--master_port={free_port()}",
            __file__,
            "--rank-of",
            str(spec_path),
        ]
        started_at, started = utc_now(), time.perf_counter()
        subprocess.run(command, check=True, capture_output=True, cwd=ROOT)
        total_s = time.perf_counter() - started
        outcomes = [_read_outcome(path) for path in sorted(Path(folder).glob("rank-*.json"))]
    return combine_outcomes(spec.name, outcomes, started_at).with_timings(total_s=total_s)


def torchrun_rank_main(spec_path: Path) -> None:
    """Inside torchrun: run this process's rank and leave its outcome next to the spec."""
    spec = ExperimentSpec.from_dict(json.loads(spec_path.read_text()))
    rank = int(os.environ["RANK"])
    # env:// is MASTER_ADDR / MASTER_PORT, through the store torchrun's agent already holds.
    outcome = run_rank(spec, rank, "env://")
    record = {**asdict(outcome), "status": outcome.status.value}
    (spec_path.parent / f"rank-{rank}.json").write_text(json.dumps(record))


def _read_outcome(path: Path) -> RankOutcome:
    record = json.loads(path.read_text())
    return RankOutcome(**{**record, "status": Status(record["status"])})


def summarize(results: list[ExperimentResult]) -> dict[str, float]:
    def median(values: list[float]) -> float:
        return statistics.median(values)

    return {
        "total_s": median([r.timings.total_s for r in results]),
        "trained_s": median([r.timings.warmup_s + r.timings.window_s for r in results]),
        "in_rank_startup_s": median([r.timings.startup_s for r in results]),
        "overhead_s": median([r.timings.overhead_s for r in results]),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--experiments", type=int, default=10)
    parser.add_argument("--mode", choices=["workload", "script"], default="workload")
    parser.add_argument("--rank-of", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.rank_of is not None:
        torchrun_rank_main(args.rank_of)
        return

    from autotune.runner.ray_runner import RayRunner

    mode = args.mode
    folder = Path(tempfile.mkdtemp(prefix="bench-overhead-"))

    def spec_of(name: str) -> ExperimentSpec:
        return benchmark_spec(name, mode, folder)

    runs: dict[str, list[ExperimentResult]] = {"ray_warm": [], "torchrun_fresh": []}
    with RayRunner(num_cpus=2) as ray_runner:
        # Starting the pool is paid once per tuning run, not per experiment.
        first = ray_runner.run(spec_of("pool-start"))
        print(f"pool start (not counted): {first.timings.total_s:.2f} s", flush=True)
        for index in range(args.experiments):
            for name, run in (("ray_warm", ray_runner.run), ("torchrun_fresh", run_torchrun)):
                result = run(spec_of(f"{name}-{index}"))
                if not result.ok:
                    raise SystemExit(f"{result.name}: {result.error}\n{result.error_detail}")
                runs[name].append(result)
                print(
                    f"{result.name:18} total {result.timings.total_s:6.2f} s  "
                    f"overhead {result.timings.overhead_s:6.2f} s",
                    flush=True,
                )

    summary = {name: summarize(results) for name, results in runs.items()}
    ratio = summary["torchrun_fresh"]["overhead_s"] / summary["ray_warm"]["overhead_s"]
    print()
    what = "script training gpt" if mode == "script" else "gpt (default)"
    print(f"median over {args.experiments} experiments, {what}, ZeRO-2, world size 2")
    print(
        f"{'runner':16} {'total':>8} {'warm-up+window':>15} {'overhead':>9} {'of it in rank':>14}"
    )
    for name, row in summary.items():
        print(
            f"{name:16} {row['total_s']:7.2f}s {row['trained_s']:14.2f}s "
            f"{row['overhead_s']:8.2f}s {row['in_rank_startup_s']:13.2f}s"
        )
    print(f"fresh torchrun / warm Ray overhead: {ratio:.1f}x")
    warm, target = summary["ray_warm"]["overhead_s"], TARGET_WARM_OVERHEAD_S[mode]
    print(
        f"targets: warm overhead <= {target:g} s: "
        f"{'met' if warm <= target else 'MISSED'}; "
        f"ratio >= {TARGET_RATIO:g}x: {'met' if ratio >= TARGET_RATIO else 'MISSED'}"
    )

    results_path = RESULTS[mode]
    results_path.parent.mkdir(exist_ok=True)
    results_path.write_text(
        json.dumps(
            {
                "benchmark": f"per-experiment overhead ({mode} mode), warm Ray actors vs "
                "fresh torchrun",
                "spec": spec_of("benchmark").to_dict(),
                "machine": {"cpus": os.cpu_count(), "platform": platform.platform()},
                "recorded_at": utc_now(),
                "median": summary,
                "ratio": ratio,
                "experiments": {
                    name: [r.to_dict() for r in results] for name, results in runs.items()
                },
            },
            indent=2,
        )
        + "\n"
    )
    shutil.rmtree(folder, ignore_errors=True)
    print(f"wrote {results_path.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
