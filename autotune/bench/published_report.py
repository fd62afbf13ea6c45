"""``autotune plan`` held against published tables and the H200 landscapes: what
``experiments/bench_cost_model.py`` prints and records (see its docstring)."""

from __future__ import annotations

import json
import math
import statistics
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from autotune.bench.published import (
    DeepSpeedTable,
    deepspeed_model,
    deepspeed_step,
    deepspeed_tables,
    llama_memory_rows,
    llama_model,
    mpt_rows,
)
from autotune.tuner.cost_model import CostModel, ModelShape, Topology, prior_for, step_counts
from autotune.tuner.hardware import CATALOG
from autotune.tuner.plan import INTERVAL_Z, PlannedConfig

LANDSCAPES = Path(__file__).resolve().parents[2] / "results" / "landscapes"


@dataclass(frozen=True)
class GpuLandscape:
    """A landscape measured on an H200 (the built-in engine, one GPU, a 40 GiB budget, bf16)
    and what its README read off it: the largest micro-batch that fit per stage and the
    allocator's slope a sample, without (False) and with (True) activation checkpointing."""

    name: str
    tables: dict[bool, str]  # paths under results/landscapes/
    largest: dict[bool, tuple[int, ...]]
    bytes_per_sample: dict[bool, float]


GPU_LANDSCAPES = (
    GpuLandscape(
        "GPT 406M (GPT-2 medium's shape)",
        {
            False: "gpu-20261127/gpt350m_bf16_40gib.json",
            True: "gpu-20261127/gpt350m_bf16_ckpt_40gib.json",
        },
        {False: (32, 32, 31, 31), True: (100, 100, 97, 95)},
        {False: 1.12e9, True: 0.36e9},
    ),
    GpuLandscape(
        "GPT 838M (GPT-2 large's shape)",
        {False: "gpu-20261128/gpt774m_bf16_40gib.json"},
        {False: (16, 16, 15, 14)},
        {False: 1.73e9},  # stage 0's peak from micro-batch 15 to 16
    ),
)
# llm-foundry's larger_mb_1.md: MPT-7B on 8 x A100-80GB, seq 2048, accumulation 2, no
# checkpointing: samples/s at each micro-batch.
MPT_7B_SWEEP = {1: 26934 / 2048, 2: 32355 / 2048, 4: 36110 / 2048, 6: 37723 / 2048}
MPT_7B = {"n_layer": 32, "d_model": 4096, "n_head": 32, "seq_len": 2048, "vocab": 50368}


def _interval(model: CostModel, counts: list[float], label: str, samples: float) -> dict[str, Any]:
    (prediction,) = model.predict([counts], [label])
    spread = math.exp(INTERVAL_Z * prediction.sd)
    throughput = samples / prediction.latency_s
    return {"throughput": throughput, "low": throughput / spread, "high": throughput * spread}


def deepspeed_report(table: DeepSpeedTable) -> dict[str, Any]:
    """A DeepSpeed table against the plan from the V100's datasheet."""
    from autotune.planning import PlanRequest, make_plan

    request = PlanRequest(
        config=table.config(),
        workload=table.workload,
        workload_args=dict(table.args),
        world_size=16,
        gpus_per_node=16,
        hardware="v100-32gb",
    )
    planned = make_plan(request)
    rows, hardware = planned.rows, planned.hardware
    topology = Topology(16, 16, table.precision)
    model = CostModel.from_prior(prior_for(hardware, topology))
    shape = ModelShape.from_info(deepspeed_model(table.name))
    fitting = [r for r in rows if r.fits]
    stages = []
    for stage, (value, micro) in sorted(table.stages.items()):
        own = [r for r in fitting if r.zero_stage == stage]
        counts = step_counts(shape, deepspeed_step(stage, micro), topology)
        at = _interval(model, counts, f"z{stage}", 16 * micro)
        stages.append(
            {
                "stage": stage,
                "published": value,
                "published_micro_batch": micro,
                "largest_fit": max((r.micro_batch_size for r in own), default=0),
                "plan_best_micro_batch": own[0].micro_batch_size if own else None,
                "predicted_at_published": at,
                "covered": value > 0 and at["low"] <= value <= at["high"],
            }
        )
    best = table.best_stage
    plan_best = fitting[0].zero_stage if fitting else None
    published_at_plan_best = (
        table.stages.get(plan_best, (0.0, 0))[0] if plan_best is not None else 0
    )
    return {
        "table": table.name,
        "role": table.role,
        "stages": stages,
        "published_best_stage": best,
        "plan_best_stage": plan_best,
        "plan_best_micro_batch": fitting[0].micro_batch_size if fitting else None,
        "best_stage_within_5pct": published_at_plan_best >= 0.95 * table.stages[best][0],
    }


def mpt_report(role: str = "calibration") -> dict[str, Any]:
    """llm-foundry's rows: predicted over published throughput, and coverage, per table."""
    by_table: dict[str, list[dict[str, Any]]] = {}
    for row in mpt_rows(role):
        hardware = CATALOG[row.hardware]
        topology = Topology(row.gpus, 8, "bf16")
        model = CostModel.from_prior(prior_for(hardware, topology))
        counts = step_counts(row.model_shape(), row.step(), topology)
        at = _interval(model, counts, "z3", row.gpus * row.micro_batch * row.grad_accum)
        by_table.setdefault(row.table, []).append(
            {
                "model": row.model,
                "seq_len": row.seq_len,
                "gpus": row.gpus,
                "micro_batch": row.micro_batch,
                "checkpointing": row.activation_checkpointing,
                "published": row.samples_per_s,
                "ratio": at["throughput"] / row.samples_per_s,
                "covered": at["low"] <= row.samples_per_s <= at["high"],
            }
        )
    return by_table


def mpt_sweep() -> dict[str, Any]:
    """The plan for an MPT-7B-shaped built-in GPT on 8 x A100-80GB at seq 2048, stage 3 as
    FSDP FULL_SHARD, accumulation 2, with and without activation checkpointing."""
    from autotune.planning import PlanRequest, make_plan

    config = {
        "bf16": {"enabled": True},
        "optimizer": {"type": "AdamW", "params": {"lr": 1.2e-4}},
        "zero_optimization": {"stage": 3},
        "gradient_accumulation_steps": 2,
        "activation_checkpointing": {"enabled": [False, True]},
        "autotuning": {"fast": True},
    }
    request = PlanRequest(config, "gpt", MPT_7B, world_size=8, hardware="a100-80gb")
    rows = make_plan(request).rows
    plain = [r for r in rows if r.fits and not r.activation_checkpointing]
    checkpointed = [r for r in rows if r.fits and r.activation_checkpointing]
    by_size = {r.micro_batch_size: r.throughput for r in plain}
    swept = [size for size in MPT_7B_SWEEP if size in by_size]
    return {
        "largest_fit": max((r.micro_batch_size for r in plain), default=0),
        "largest_fit_checkpointed": max((r.micro_batch_size for r in checkpointed), default=0),
        "plan_best": _describe(rows[0]) if rows and rows[0].fits else None,
        "best_checkpointed": _describe(checkpointed[0]) if checkpointed else None,
        "published_order": sorted(MPT_7B_SWEEP, key=lambda s: -MPT_7B_SWEEP[s]),
        "plan_order": sorted(swept, key=lambda s: -by_size[s]),
        "predicted": {size: by_size.get(size) for size in MPT_7B_SWEEP},
        "published": MPT_7B_SWEEP,
    }


def _describe(row: PlannedConfig) -> dict[str, Any]:
    return {
        "name": row.name,
        "micro_batch": row.micro_batch_size,
        "throughput": row.throughput,
        "range": (row.throughput_low, row.throughput_high),
    }


def landscape_report(landscape: GpuLandscape) -> dict[str, Any]:
    """An H200 landscape (held out): each measured configuration against the plan's 80%
    interval, and the plan's largest fit and activations a sample against the measured."""
    import torch

    from autotune.config import load_config
    from autotune.profiling.model_info import model_info_on_meta
    from autotune.tuner.memory import estimate_memory
    from autotune.tuner.model_search import step_shape
    from autotune.tuner.space import Variant, build_space
    from autotune.workloads import resolve_workload

    tables = {
        checkpointed: json.loads((LANDSCAPES / path).read_text())
        for checkpointed, path in landscape.tables.items()
    }
    how = tables[False]["how"]
    args = {k: v for k, v in how["workload_args"].items() if k != "activation_checkpointing"}
    with torch.device("meta"):
        workload = resolve_workload(how["workload"], args)
    info = model_info_on_meta(workload, "bf16", workload.activation_checkpointing)
    config = load_config({**how["config"], "zero_optimization": {"stage": 0}}, 1)
    budget = int(how["device_memory_bytes"])
    hardware = replace(CATALOG["h200-141gb"], memory_bytes=budget)
    topology = Topology(1, 1, "bf16")
    model = CostModel.from_prior(prior_for(hardware, topology))
    shape = ModelShape.from_info(info)
    base = build_space(config).base
    points, largest = [], {}
    for checkpointed, table in tables.items():
        for name, entry in table["configs"].items():
            if entry["status"] != "ok":
                continue
            stage = entry["overrides"]["zero_optimization.stage"]
            micro = entry["overrides"]["train_micro_batch_size_per_gpu"]
            variant = Variant(stage, activation_checkpointing=checkpointed)
            step = step_shape(config, dict(base), variant, micro)
            at = _interval(model, step_counts(shape, step, topology), variant.label, micro)
            measured = statistics.median(entry["throughput"])
            points.append(
                {
                    "name": name + ("_ac" if checkpointed else ""),
                    "measured": measured,
                    **at,
                    "covered": at["low"] <= measured <= at["high"],
                }
            )
        largest[str(checkpointed)] = [
            estimate_memory(
                info, config, stage, False, budget, activation_checkpointing=checkpointed
            ).max_micro_batch_size(1024)
            for stage in range(4)
        ]
    return {
        "model": landscape.name,
        "points": points,
        "largest_fit": largest,
        "measured_largest_fit": {str(k): list(v) for k, v in landscape.largest.items()},
        "bytes_per_sample": {
            "counted": {str(c): info.step_bytes(c) for c in landscape.tables},
            "measured": {str(c): v for c, v in landscape.bytes_per_sample.items()},
        },
    }


# Predicted memory within this share of a published figure counts as matching it.
MEMORY_TOLERANCE = 0.15


def llama_memory_report() -> list[dict[str, Any]]:
    """Each held-out Llama run against the plan of ``hf:llama`` in its shape: the plan's
    memory per GPU and whether it fits, at the run's stage, micro-batch and checkpointing."""
    from autotune.config import load_config
    from autotune.tuner.plan import plan

    reports = []
    for row in llama_memory_rows():
        config = load_config(row.config(), row.shards)
        rows = plan(
            config, llama_model(row.model, row.seq_len), CATALOG[row.hardware], min(8, row.shards)
        )
        planned = next(
            r
            for r in rows
            if r.zero_stage == row.zero_stage
            and r.micro_batch_size == row.micro_batch
            and r.offload == "none"
        )
        predicted_gib = planned.memory_bytes / 2**30
        ratio = predicted_gib / row.memory_gib if row.memory_gib else None
        reports.append(
            {
                "source": row.source,
                "model": row.model,
                "zero_stage": row.zero_stage,
                "shards": row.shards,
                "micro_batch": row.micro_batch,
                "grad_accum": row.grad_accum,
                "checkpointing": row.activation_checkpointing,
                "published_gib": row.memory_gib,
                "predicted_gib": predicted_gib,
                "ratio": ratio,
                "within_tolerance": None if ratio is None else abs(ratio - 1) <= MEMORY_TOLERANCE,
                "published_fits": row.fits,
                "plan_fits": planned.fits,
            }
        )
    return reports


def _print_llama_memory(reports: list[dict[str, Any]]) -> None:
    print(
        f"{'source':18s} {'model':10s} {'z':>1s} {'GPUs':>4s} {'mbs':>3s} {'acc':>3s} "
        f"{'ckpt':>4s} {'published':>9s} {'plan':>8s} {'ratio':>5s} {'fits: run/plan':>14s}"
    )
    for r in reports:
        published = f"{r['published_gib']:.1f}" if r["published_gib"] else "-"
        ratio = f"{r['ratio']:.2f}" if r["ratio"] is not None else "-"
        fits = f"{'yes' if r['published_fits'] else 'no'}/{'yes' if r['plan_fits'] else 'no'}"
        checkpointing = "yes" if r["checkpointing"] else "no"
        print(
            f"{r['source']:18s} {r['model']:10s} {r['zero_stage']:1d} {r['shards']:4d} "
            f"{r['micro_batch']:3d} {r['grad_accum']:3d} {checkpointing:>4s} "
            f"{published:>9s} {r['predicted_gib']:8.1f} {ratio:>5s} {fits:>14s}"
        )
    verdicts = [r["published_fits"] == r["plan_fits"] for r in reports]
    close = [r["within_tolerance"] for r in reports if r["within_tolerance"] is not None]
    print(
        f"fits verdict right: {_coverage(verdicts)}; predicted memory within "
        f"{MEMORY_TOLERANCE:.0%} of the published: {_coverage(close)}"
    )


def _coverage(flags: list[bool]) -> str:
    return f"{sum(flags)}/{len(flags)} ({sum(flags) / max(1, len(flags)):.0%})"


def _print_deepspeed(reports: list[dict[str, Any]]) -> list[bool]:
    print(
        f"{'table':11s} {'z':>1s} {'published @mbs':>16s} {'plan: largest':>13s} "
        f"{'predicted @published mbs (80%)':>32s} {'ratio':>6s}"
    )
    covered = []
    for report in reports:
        for s in report["stages"]:
            at = s["predicted_at_published"]
            value = s["published"]
            shown = (
                f"{value:.1f} @{s['published_micro_batch']}"
                if value
                else (f"failed @{s['published_micro_batch']}")
            )
            ratio = f"{at['throughput'] / value:6.2f}" if value else "     -"
            if value:
                covered.append(s["covered"])
            print(
                f"{report['table']:11s} {s['stage']:1d} {shown:>16s} {s['largest_fit']:13d} "
                f"{at['throughput']:12.1f} ({at['low']:.0f}-{at['high']:.0f}){'':>6s} {ratio}"
            )
        print(
            f"{report['table']:11s} best: published z{report['published_best_stage']}, plan "
            f"z{report['plan_best_stage']} mbs {report['plan_best_micro_batch']} "
            f"(published best within 5%: {'yes' if report['best_stage_within_5pct'] else 'NO'})"
        )
    return covered


def print_published() -> dict[str, Any]:
    """Part 2 of the benchmark: print and return it."""
    print("\n2. Published tables vs autotune plan (the datasheet and the calibration alone)")
    print("2a. calibration: DeepSpeed autotuning, 16 x V100-32GB")
    calibration = [deepspeed_report(t) for t in deepspeed_tables("calibration")]
    covered = _print_deepspeed(calibration)
    print("2b. calibration: llm-foundry MPT (FSDP FULL_SHARD), predicted / published")
    mpt = mpt_report("calibration")
    for table, rows in mpt.items():
        ratios = [r["ratio"] for r in rows]
        flags = [r["covered"] for r in rows]
        covered += flags
        print(
            f"{table:24s} {len(rows):3d} rows, ratio median {statistics.median(ratios):.2f} "
            f"(range {min(ratios):.2f}-{max(ratios):.2f}), inside 80%: {_coverage(flags)}"
        )
    sweep = mpt_sweep()
    print(
        f"MPT-7B sweep, 8 x A100-80GB, seq 2048: published order {sweep['published_order']}, "
        f"plan {sweep['plan_order']}; largest fit {sweep['largest_fit']} (published ran 6), "
        f"{sweep['largest_fit_checkpointed']} checkpointed; plan's best "
        f"{sweep['plan_best']['name'] if sweep['plan_best'] else None}"
    )
    for size, value in sweep["published"].items():
        predicted = sweep["predicted"][size]
        shown = f"{predicted:.1f}" if predicted else "does not fit"
        print(f"  mbs {size}: published {value:.1f} samples/s, plan {shown}")
    print(f"calibration coverage of the 80% interval: {_coverage(covered)}")

    print("\n2c. held out (not fitted): DeepSpeed autotuning, 16 x V100-32GB")
    held_out = [deepspeed_report(t) for t in deepspeed_tables("held-out")]
    held_covered = _print_deepspeed(held_out)
    print("2d. held out: the H200 landscapes (built-in engine, 1 GPU, 40 GiB, bf16)")
    landscapes = [landscape_report(landscape) for landscape in GPU_LANDSCAPES]
    for landscape in landscapes:
        print(f"  {landscape['model']}")
        for point in landscape["points"]:
            held_covered.append(point["covered"])
            print(
                f"  {point['name']:14s} measured {point['measured']:6.1f}  predicted "
                f"{point['throughput']:6.1f} ({point['low']:.0f}-{point['high']:.0f})  ratio "
                f"{point['throughput'] / point['measured']:.2f}"
            )
        plan, measured = landscape["largest_fit"], landscape["measured_largest_fit"]
        counted, slope = (landscape["bytes_per_sample"][k] for k in ("counted", "measured"))
        for checkpointed in plan:
            how = "checkpointed" if checkpointed == "True" else "not checkpointed"
            print(
                f"  {how}: largest fit per stage: plan {plan[checkpointed]}, measured "
                f"{measured[checkpointed]}; activations a sample: counted "
                f"{counted[checkpointed] / 1e9:.2f} GB, measured {slope[checkpointed] / 1e9:.2f}"
            )
    print(f"held-out coverage of the 80% interval: {_coverage(held_covered)}")
    print(
        "2e. held out: memory per GPU of published Llama runs (GiB) against the plan of "
        "hf:llama in their shape (experiments/published/llama_memory.json)"
    )
    llama = llama_memory_report()
    _print_llama_memory(llama)
    return {
        "calibration": {"deepspeed": calibration, "llm_foundry": mpt, "mpt_7b_sweep": sweep},
        "held_out": {
            "deepspeed": held_out,
            "h200_landscapes": landscapes,
            "llama_memory": llama,
        },
    }
