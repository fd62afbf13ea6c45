"""Measure a tuning landscape: every configuration a tuner may ask for, repeated, interleaved.

A tabular benchmark (see ``autotune.runner.table``): the tuners are then replayed against the
table thousands of times, deterministically and in seconds, instead of against a machine whose
step times vary ±50% run to run.

What is measured, for one workload, config and device-memory budget:

1. the search for each variant's largest micro-batch, exactly as the tuner runs it (the sizes
   it visits do not depend on the tuner type, only their order does), out-of-memory sizes
   included;
2. the grid: per variant, every micro-batch size the micro-batch phase compares x every point
   of the variant's default knobs (``fast: false``), plus the sizes visited in step 1;
3. every ok configuration of the grid ``--repeats`` times, in rounds (each round every
   configuration once, in a shuffled order), so that a slow spell of the machine hits all
   configurations alike; the table keeps every measurement, the median is its value.

    python experiments/landscape.py --workload gpt -a n_layer=2 --device-memory 96MiB \
        --out results/landscapes/gpt_tight.json
    python experiments/landscape.py --extend 2 --out results/landscapes/gpt_tight.json

``--extend N`` measures every ok configuration of an existing table N more times, in rounds as
before, and appends the measurements (more repeats steady the medians on a noisy machine).
"""

from __future__ import annotations

import argparse
import datetime
import itertools
import json
import os
import platform
import random
import statistics
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from autotune.config import load_config
from autotune.config.sizes import parse_size
from autotune.experiment import ExperimentResult
from autotune.runner.table import LANDSCAPE_FORMAT, tuning_config
from autotune.tuner import Phase, Tuner, build_space
from autotune.tuning import TuningJob, experiment_spec
from autotune.workloads import parse_workload_args


def probe_largest_micro_batches(
    job: TuningJob, info: Any, runner: Any
) -> tuple[Tuner, list[ExperimentResult]]:
    """The tuner's own search for each variant's largest micro-batch, run for real."""
    tuner = Tuner(job.config, info, device_memory_bytes=job.memory_budget)
    results = []
    while (candidate := tuner.ask()) is not None and candidate.phase is Phase.max_micro_batch:
        result = runner.run(experiment_spec(job, candidate, info.flops_per_sample))
        print(f"probe {candidate.name}: {result.status.value}", flush=True)
        tuner.tell(result)
        results.append(result)
    return tuner, results


def grid(job: TuningJob, info: Any, probes: list[ExperimentResult]) -> dict[str, dict[str, Any]]:
    """Name → overrides of every configuration to measure (see the module docstring)."""
    space = build_space(job.config, info, job.memory_budget)
    by_name: dict[str, dict[str, Any]] = {}
    ok = {r.name for r in probes if r.ok}
    for plan in space.plans:
        sizes = [s for s in plan.ladder if space.name(space.overrides(plan.variant, s)) in ok]
        if not sizes:
            continue
        points = [
            dict(zip([k for k, _ in plan.knobs], combo, strict=True))
            for combo in itertools.product(*(v for _, v in plan.knobs))
        ]
        for size in plan.compared_sizes(max(sizes)):
            for knobs in [{}, *points]:
                overrides = space.overrides(plan.variant, size, knobs)
                by_name[space.name(overrides)] = overrides
        for size in sizes:
            overrides = space.overrides(plan.variant, size)
            by_name[space.name(overrides)] = overrides
    return by_name


def measure(
    job: TuningJob, info: Any, runner: Any, configs: Mapping[str, Mapping[str, Any]], repeats: int
) -> dict[str, list[ExperimentResult]]:
    """Every configuration ``repeats`` times, round by round, each round shuffled."""
    from autotune.tuner import Candidate

    results: dict[str, list[ExperimentResult]] = {name: [] for name in configs}
    order = list(configs)
    rng = random.Random(0)
    started = time.monotonic()
    for round_index in range(repeats):
        rng.shuffle(order)
        for done, name in enumerate(order, start=1):
            if results[name] and not results[name][0].ok:
                continue  # an oom is measured once: it is not noise
            ds_config = job.config.with_overrides(configs[name]).to_dict()
            ds_config.pop("autotuning", None)
            candidate = Candidate(name, configs[name], ds_config, Phase.knobs)
            results[name].append(runner.run(experiment_spec(job, candidate, info.flops_per_sample)))
            if done % 25 == 0:
                print(
                    f"round {round_index + 1}/{repeats}: {done}/{len(order)} "
                    f"({time.monotonic() - started:.0f} s)",
                    flush=True,
                )
    return results


def extend(path: Path, rounds: int, runner_kind: str) -> None:
    """Append ``rounds`` more rounds of every ok configuration to the table at ``path``."""
    from autotune.profiling.model_info import ModelInfo

    table = json.loads(path.read_text())
    how = table["how"]
    job = TuningJob(
        config=load_config(how["config"], world_size=how["world_size"]),
        workload=how["workload"],
        workload_args=how["workload_args"],
        device_memory_bytes=how["device_memory_bytes"],
    )
    info = ModelInfo(**table["model_info"])
    ok = {n: c["overrides"] for n, c in table["configs"].items() if c["status"] == "ok"}
    started = time.monotonic()
    with _runner(runner_kind) as runner:
        measured = measure(job, info, runner, ok, rounds)
    for name, runs in measured.items():
        entry = table["configs"][name]
        entry["throughput"] += [r.metrics.throughput for r in runs if r.ok and r.metrics]
        entry["duration_s"] += [round(r.duration_s, 3) for r in runs]
    how["repeats"] += rounds
    when = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
    wall_s = round(time.monotonic() - started, 1)
    how["extended"] = [*how.get("extended", []), {"rounds": rounds, "at": when, "wall_s": wall_s}]
    path.write_text(json.dumps(table, indent=1) + "\n")
    print(f"extended {path}: {len(ok)} configurations x {rounds} more rounds")


def _runner(kind: str) -> Any:
    if kind == "ray":
        from autotune.runner.ray_runner import RayRunner

        return RayRunner(num_cpus=2)
    from autotune.runner import LocalRunner

    return LocalRunner()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workload", default="gpt")
    parser.add_argument("--workload-arg", "-a", action="append", default=[])
    parser.add_argument("--device-memory", help="per-rank budget, e.g. 96MiB")
    parser.add_argument("--extend", type=int, default=0, help="more rounds on an existing table")
    parser.add_argument("--max-micro-batch", type=int, default=64)
    parser.add_argument("--num-micro-batches", type=int, default=2, help="sizes compared")
    parser.add_argument("--stages", default="0,1,2,3")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--start-profile-step", type=int, default=2)
    parser.add_argument("--end-profile-step", type=int, default=4)
    parser.add_argument("--runner", choices=["ray", "local"], default="ray")
    parser.add_argument("--note", default="", help="conditions worth recording")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    if args.extend:
        extend(args.out, args.extend, args.runner)
        return
    if args.device_memory is None:
        parser.error("--device-memory is required to measure a new landscape")

    from autotune.profiling.model_info import model_info
    from autotune.workloads import resolve_workload

    spec = tuning_config(
        stages=[int(s) for s in args.stages.split(",")],
        max_micro_batch=args.max_micro_batch,
        num_micro_batches=args.num_micro_batches,
        start_profile_step=args.start_profile_step,
        end_profile_step=args.end_profile_step,
    )
    workload_args = parse_workload_args(args.workload_arg)
    job = TuningJob(
        config=load_config(spec, world_size=2),
        workload=args.workload,
        workload_args=workload_args,
        device_memory_bytes=parse_size(args.device_memory),
    )
    info = model_info(resolve_workload(args.workload, workload_args), 1)
    started = time.monotonic()
    with _runner(args.runner) as runner:
        _, probes = probe_largest_micro_batches(job, info, runner)
        configs = grid(job, info, probes)
        print(f"{len(configs)} configurations x {args.repeats} repeats", flush=True)
        measured = measure(job, info, runner, configs, args.repeats)
    table = {
        "format": LANDSCAPE_FORMAT,
        "how": {
            "workload": args.workload,
            "workload_args": workload_args,
            "world_size": 2,
            "device_memory_bytes": job.memory_budget,
            "config": spec,
            "repeats": args.repeats,
            "profile_window": [args.start_profile_step, args.end_profile_step],
            "runner": args.runner,
            "measured_at": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            "wall_s": round(time.monotonic() - started, 1),
            "machine": f"{platform.machine()}, {os.cpu_count()} cores, {platform.system()}",
            "note": args.note,
        },
        "model_info": {
            "num_params": info.num_params,
            "param_bytes": info.param_bytes,
            "activation_bytes_per_sample": info.activation_bytes_per_sample,
            "flops_per_sample": info.flops_per_sample,
        },
        "configs": {
            name: {
                "overrides": dict(configs[name]),
                "status": runs[0].status.value if runs else "error",
                "throughput": [r.metrics.throughput for r in runs if r.ok and r.metrics],
                "duration_s": [round(r.duration_s, 3) for r in runs],
                "peak_memory_bytes": max(
                    (r.metrics.peak_memory_bytes for r in runs if r.metrics), default=None
                ),
                "error": next((r.error for r in runs if r.error), None),
            }
            for name, runs in measured.items()
        },
    }
    # The probes that ran out of memory are part of the table: a tuner meets them too.
    for result in probes:
        if not result.ok and result.name not in table["configs"]:
            table["configs"][result.name] = {
                "status": result.status.value,
                "throughput": [],
                "duration_s": [round(result.duration_s, 3)],
                "error": result.error,
            }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(table, indent=1) + "\n")
    values = [
        statistics.median(c["throughput"]) for c in table["configs"].values() if c["throughput"]
    ]
    print(
        f"wrote {args.out}: {len(values)} ok configurations; best {max(values):.2f}, "
        f"median {statistics.median(values):.2f} samples/s "
        f"(best/median {max(values) / statistics.median(values):.2f})"
    )


if __name__ == "__main__":
    main()
