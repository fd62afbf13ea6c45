"""Measure a tuning landscape: every configuration a tuner may ask for, repeated, interleaved.

A tabular benchmark (see ``autotune.bench.table``): the tuners are then replayed against the
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

``--refine N`` then resolves the top of the table, where a tuner is judged (is its choice
within 2% of the best?): up to N more rounds, each over only the configurations whose side of
that line is still uncertain (see :func:`unresolved`), leader included. A handful of repeats
leaves the top a draw among near-ties: the best median is the luckiest of them (on the first
gpt_long table, 3% above the next after 10 rounds; the same configurations re-measured came
out within 3% of each other in another order).

    python experiments/landscape.py --refine 40 --out results/landscapes/gpt_tight.json
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import itertools
import json
import math
import os
import platform
import random
import statistics
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from autotune.bench.table import (
    LANDSCAPE_FORMAT,
    WITHIN,
    landscape_job,
    measured_configs,
    tuning_config,
)
from autotune.config import load_config
from autotune.config.knobs import MICRO_BATCH_KEY
from autotune.config.sizes import parse_size
from autotune.experiment import ExperimentResult, Status
from autotune.job import TuningJob, experiment_spec
from autotune.profiling.model_info import ModelInfo
from autotune.tuner import Phase, Ranked, Tuner, build_space
from autotune.tuner.ranking import relative_noise
from autotune.workloads import parse_workload_args

# How sure refining must be of each configuration's side of the benchmark's line (two-sided
# 95%).
REFINE_Z = 1.96


def probe_largest_micro_batches(
    job: TuningJob, info: Any, runner: Any
) -> tuple[Tuner, list[ExperimentResult]]:
    """The tuner's own search for each variant's largest micro-batch, run for real (the
    phase-by-phase tuners search it first; model_based, the default, has no such phase)."""
    config = job.config.with_overrides({"autotuning.tuner_type": "gridsearch"})
    tuner = Tuner(config, info, device_memory_bytes=job.memory_budget)
    results = []
    while (candidate := tuner.ask()) is not None and candidate.phase is Phase.max_micro_batch:
        result = runner.run(experiment_spec(job, candidate, info.flops_per_sample))
        print(f"probe {candidate.name}: {result.status.value} ({result.duration_s:.1f} s)")
        tuner.tell(result)
        results.append(result)
    return tuner, results


def grid(
    job: TuningJob, info: Any, probes: list[ExperimentResult], knobs: bool = True
) -> dict[str, dict[str, Any]]:
    """Name → overrides of every configuration to measure (see the module docstring);
    without ``knobs``, stage x micro-batch only: the sizes compared, the probes' and the
    powers of two up to the largest fit (throughput against micro-batch, per stage)."""
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
            for point in [{}, *points] if knobs else [{}]:
                overrides = space.overrides(plan.variant, size, point)
                by_name[space.name(overrides)] = overrides
        sweep = [] if knobs else [2**k for k in range(1, max(sizes).bit_length())]
        for size in [*sizes, *sweep]:
            overrides = space.overrides(plan.variant, size)
            by_name[space.name(overrides)] = overrides
    return by_name


def sized_grid(job: TuningJob, info: Any, sizes: list[int]) -> dict[str, dict[str, Any]]:
    """Name → overrides of every variant at each of ``sizes``, no probing: what does not fit
    is measured once, as an out-of-memory result."""
    space = build_space(job.config, info, job.memory_budget)
    by_name = {}
    for plan in space.plans:
        for size in sizes:
            overrides = space.overrides(plan.variant, size)
            by_name[space.name(overrides)] = overrides
    return by_name


def measure(
    job: TuningJob,
    info: Any,
    runner: Any,
    configs: Mapping[str, Mapping[str, Any]],
    repeats: int,
    deadline: float = math.inf,
    climb: bool = True,
) -> dict[str, list[ExperimentResult]]:
    """Every configuration ``repeats`` times, round by round, each round shuffled; no
    experiment starts after ``deadline`` (``time.monotonic()``), so a round may be partial.

    With ``climb``, the first round goes up the micro-batches (the variants interleaved). A
    size at or above one of its variant's that ran out of memory is not run: it would fail
    too, and a replay answers it so from the smaller size's failure (``TableRunner``). So
    sizes given past the fit cost one failed experiment a variant, not one each."""
    from autotune.tuner import Candidate

    results: dict[str, list[ExperimentResult]] = {name: [] for name in configs}
    order = list(configs)
    rng = random.Random(0)
    started = time.monotonic()

    def variant(name: str) -> tuple[tuple[str, Any], ...]:
        overrides = configs[name]
        return tuple(sorted((k, v) for k, v in overrides.items() if k != MICRO_BATCH_KEY))

    def failed_below(name: str) -> bool:
        size = configs[name].get(MICRO_BATCH_KEY, 0)
        return any(
            runs
            and not runs[0].ok
            and runs[0].status is Status.oom
            and variant(other) == variant(name)
            and configs[other].get(MICRO_BATCH_KEY, 0) <= size
            for other, runs in results.items()
            if other != name
        )

    for round_index in range(repeats):
        rng.shuffle(order)
        if climb and round_index == 0:
            order.sort(key=lambda name: configs[name].get(MICRO_BATCH_KEY, 0))
        for done, name in enumerate(order, start=1):
            if results[name] and not results[name][0].ok:
                continue  # an oom is measured once: it is not noise
            if not results[name] and failed_below(name):
                continue
            if time.monotonic() >= deadline:
                print(f"time limit: stopped in round {round_index + 1}", flush=True)
                return results
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


def extend(path: Path, rounds: int, runner_kind: str, time_limit_s: float = math.inf) -> None:
    """Append ``rounds`` more rounds of every ok configuration to the table at ``path``; no
    experiment starts ``time_limit_s`` after the first (the last round may be partial)."""
    table = json.loads(path.read_text())
    how = table["how"]
    job = landscape_job(table)
    info = ModelInfo(**table["model_info"])
    ok = {n: c["overrides"] for n, c in table["configs"].items() if c["status"] == "ok"}
    started = time.monotonic()
    with _runner(runner_kind, job) as runner:
        measured = measure(
            job, info, runner, ok, rounds, deadline=started + time_limit_s, climb=False
        )
    _append(table, measured)
    counts = [len(table["configs"][name]["throughput"]) for name in ok]
    how["repeats"], how["most_repeats"] = min(counts), max(counts)
    wall_s = round(time.monotonic() - started, 1)
    how["extended"] = [*how.get("extended", []), {"rounds": rounds, "at": _now(), "wall_s": wall_s}]
    path.write_text(json.dumps(table, indent=1) + "\n")
    print(f"extended {path}: {len(ok)} configurations x {rounds} more rounds")


def unresolved(
    table: Mapping[str, Any], within: float = WITHIN, confidence_z: float = REFINE_Z
) -> list[str]:
    """The ok configurations whose side of the line ``within`` of the best is uncertain: the
    gap between a configuration's median and the leader's is within ``confidence_z``
    uncertainties of the line, with the table's pooled noise. The leader, whose median draws
    the line, is one while any other is. Empty once the top is resolved.

    Example:
        >>> spread = (0.95, 1.0, 1.05)  # each configuration: ±5% a measurement
        >>> def table(medians, n):
        ...     configs = {name: {"status": "ok", "throughput": [m * f for f in spread * n]}
        ...                for name, m in medians.items()}
        ...     return {"configs": configs}
        >>> medians = {"lead": 100, "tie": 99.8, "near": 97.5, "behind": 90, "far": 70}
        >>> unresolved(table(medians, 1))  # 3 measurements each
        ['lead', 'tie', 'near', 'behind']
        >>> unresolved(table(medians, 30))  # 90 each: only "near" may be either side of 98
        ['lead', 'near']
        >>> unresolved(table({"lead": 100, "tie": 99.8, "behind": 90}, 30))
        []
    """
    ranked = measured_configs(table)
    noise = relative_noise(ranked) or 0.0
    leader, line = ranked[0], -math.log(within)

    def uncertainty(other: Ranked) -> float:
        # A median of n measurements with relative noise s wanders by about 1.25 s / sqrt(n).
        variance = 1 / leader.num_measurements + 1 / other.num_measurements
        return confidence_z * 1.25 * noise * math.sqrt(variance)

    names = [
        r.name for r in ranked[1:] if abs(math.log(leader.value / r.value) - line) < uncertainty(r)
    ]
    return [leader.name, *names] if names else []


def refine(path: Path, rounds: int, runner_kind: str) -> None:
    """Up to ``rounds`` more rounds over the table's :func:`unresolved` configurations."""
    table = json.loads(path.read_text())
    job = landscape_job(table)
    info = ModelInfo(**table["model_info"])
    started = time.monotonic()
    done = 0
    with _runner(runner_kind, job) as runner:
        for done in range(1, rounds + 1):
            names = unresolved(table)
            if not names:
                done -= 1
                break
            print(f"refine round {done}/{rounds}: {len(names)} unresolved", flush=True)
            configs = {name: table["configs"][name]["overrides"] for name in names}
            _append(table, measure(job, info, runner, configs, 1))
    table["how"]["refined"] = {
        "rounds": done,
        "within": WITHIN,
        "confidence_z": REFINE_Z,
        "unresolved_after": unresolved(table),
        "at": _now(),
        "wall_s": round(time.monotonic() - started, 1),
    }
    path.write_text(json.dumps(table, indent=1) + "\n")
    print(f"refined {path}: {done} rounds, {len(unresolved(table))} still unresolved")


def merge(path: Path, other: Path) -> None:
    """Add to the table at ``path`` the configurations of the table at ``other`` (the same
    workload, config and budget, measured in another session) that it lacks; ``how.sessions``
    says which sizes came from which."""
    table, extra = json.loads(path.read_text()), json.loads(other.read_text())
    keys = ("workload", "workload_args", "world_size", "device_memory_bytes")
    differ = [key for key in keys if table["how"].get(key) != extra["how"].get(key)]
    if differ:
        raise SystemExit(f"--merge {other}: not the same landscape as {path} ({', '.join(differ)})")
    added = {n: c for n, c in extra["configs"].items() if n not in table["configs"]}
    table["configs"].update(added)

    def session(how: Mapping[str, Any], names: Any) -> dict[str, Any]:
        configs = [table["configs"][n] for n in names]
        sizes = sorted({c["overrides"][MICRO_BATCH_KEY] for c in configs if "overrides" in c})
        return {"measured_at": how["measured_at"], "wall_s": how["wall_s"], "micro_batches": sizes}

    how = table["how"]
    how["sessions"] = how.get("sessions") or [session(how, set(table["configs"]) - set(added))]
    how["sessions"].append(session(extra["how"], added))
    counts = [len(c["throughput"]) for c in table["configs"].values() if c["status"] == "ok"]
    how["repeats"], how["most_repeats"] = min(counts), max(counts)
    path.write_text(json.dumps(table, indent=1) + "\n")
    print(f"merged {len(added)} configurations of {other} into {path}")


def _append(table: dict[str, Any], measured: Mapping[str, list[ExperimentResult]]) -> None:
    for name, runs in measured.items():
        entry = table["configs"][name]
        entry["throughput"] += [r.metrics.throughput for r in runs if r.ok and r.metrics]
        entry["duration_s"] += [round(r.duration_s, 3) for r in runs]


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")


def ray_runner(job: TuningJob) -> Any:
    """A fresh Ray cluster with every rank's cores and no more: a table measures one
    experiment at a time."""
    from autotune.runner.ray_runner import RayRunner

    return RayRunner(num_cpus=job.world_size * job.cpus_per_rank)


def _runner(kind: str, job: TuningJob) -> Any:
    if kind == "ray":
        return ray_runner(job)
    from autotune.runner import InProcessRunner, LocalRunner

    # In-process: one GPU, where a process per experiment would cost more than the experiment.
    return contextlib.nullcontext(InProcessRunner() if kind == "inprocess" else LocalRunner())


def _device_name() -> str:
    import torch

    if not torch.cuda.is_available():
        return "cpu"
    return f"{torch.cuda.get_device_name()}, torch {torch.__version__}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workload", default="gpt")
    parser.add_argument("--workload-arg", "-a", action="append", default=[])
    parser.add_argument("--device-memory", help="per-rank budget, e.g. 96MiB")
    parser.add_argument("--extend", type=int, default=0, help="more rounds on an existing table")
    parser.add_argument(
        "--merge", type=Path, help="add another session's table of the same landscape to --out"
    )
    parser.add_argument(
        "--refine", type=int, default=0, help="up to N more rounds on its unresolved top"
    )
    parser.add_argument("--max-micro-batch", type=int, default=64)
    parser.add_argument("--num-micro-batches", type=int, default=2, help="sizes compared")
    parser.add_argument("--stages", default="0,1,2,3")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--start-profile-step", type=int, default=2)
    parser.add_argument("--end-profile-step", type=int, default=4)
    parser.add_argument("--runner", choices=["ray", "local", "inprocess"], default="ray")
    parser.add_argument(
        "--no-knobs", action="store_true", help="stage x micro-batch only, no knob points"
    )
    parser.add_argument(
        "--micro-batches",
        type=lambda text: [int(v) for v in text.split(",")],
        help="measure these sizes per stage instead of probing for the largest fit",
    )
    parser.add_argument("--bf16", action="store_true", help="train in bf16 (bf16.enabled)")
    parser.add_argument(
        "--time-limit-s",
        type=float,
        default=math.inf,
        help="start no experiment this many seconds after the grid's start; the table keeps "
        "what was measured",
    )
    parser.add_argument("--world-size", type=int, default=2)
    parser.add_argument("--cpus-per-rank", type=int, default=1, help="torch threads per rank")
    parser.add_argument("--note", default="", help="conditions worth recording")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    if args.extend or args.refine or args.merge:
        if not args.out.is_file():
            parser.error(f"--out {args.out}: no landscape there to extend, refine or merge into")
        if args.merge:
            merge(args.out, args.merge)
        if args.extend:
            extend(args.out, args.extend, args.runner, args.time_limit_s)
        if args.refine:
            refine(args.out, args.refine, args.runner)
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
    if args.bf16:
        spec["bf16"] = {"enabled": True}
    workload_args = parse_workload_args(args.workload_arg)
    job = TuningJob(
        config=load_config(spec, world_size=args.world_size),
        workload=args.workload,
        workload_args=workload_args,
        device_memory_bytes=parse_size(args.device_memory),
        cpus_per_rank=args.cpus_per_rank,
    )
    info = model_info(resolve_workload(args.workload, workload_args), 1)
    started = time.monotonic()
    with _runner(args.runner, job) as runner:
        if args.micro_batches:
            probes, configs = [], sized_grid(job, info, args.micro_batches)
        else:
            _, probes = probe_largest_micro_batches(job, info, runner)
            configs = grid(job, info, probes, knobs=not args.no_knobs)
        print(f"{len(configs)} configurations x {args.repeats} repeats", flush=True)
        deadline = time.monotonic() + args.time_limit_s
        measured = measure(job, info, runner, configs, args.repeats, deadline=deadline)
    measured = {name: runs for name, runs in measured.items() if runs}
    rounds = [len(runs) for runs in measured.values() if runs[0].ok]
    table = {
        "format": LANDSCAPE_FORMAT,
        "how": {
            "workload": args.workload,
            "workload_args": workload_args,
            "world_size": args.world_size,
            "cpus_per_rank": args.cpus_per_rank,
            "device_memory_bytes": job.memory_budget,
            "config": spec,
            "knobs": not args.no_knobs,
            "repeats": min(rounds, default=0),
            "most_repeats": max(rounds, default=0),
            "profile_window": [args.start_profile_step, args.end_profile_step],
            "runner": args.runner,
            "measured_at": _now(),
            "wall_s": round(time.monotonic() - started, 1),
            "machine": f"{platform.machine()}, {os.cpu_count()} cores, {platform.system()}",
            "device": _device_name(),
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
    if not values:
        print(f"wrote {args.out}: nothing ran ok")
        return
    print(
        f"wrote {args.out}: {len(values)} ok configurations; best {max(values):.2f}, "
        f"median {statistics.median(values):.2f} samples/s "
        f"(best/median {max(values) / statistics.median(values):.2f})"
    )


if __name__ == "__main__":
    main()
