"""The calibration: the shares of the datasheets it fits are the ones that made the step
times, its misfit is what it cannot explain, and a plan's doubt is that misfit; and the stage
costs the issue found missing are in the calibrated model (stage 3's gathers, stage 2's hooks)."""

from __future__ import annotations

import json
import math
import random

import numpy as np
import pytest

from autotune.bench.published_report import GPU_LANDSCAPES, GpuLandscape, landscape_report
from autotune.tuner.calibration import (
    CalibrationRow,
    calibrate,
    calibrated_ratios,
    datasheet_basis,
)
from autotune.tuner.cost_model import (
    CONSTANTS,
    NAMES,
    CostModel,
    ModelShape,
    StepShape,
    Topology,
    prior_for,
    step_counts,
    step_seconds,
)
from autotune.tuner.hardware import CATALOG

GPT2_LARGE = ModelShape(
    num_params=774_000_000,
    flops_per_sample=5.3e12,
    num_param_tensors=436,
    module_param_counts=(1_638_400, 1_966_080, 6_553_600, 6_553_600, 2_560, 2_560) * 36,
)


def _u(shares: dict[str, float], hardware_name: str, precision: str) -> np.ndarray:
    basis = datasheet_basis(CATALOG[hardware_name], precision)
    return np.array(
        [
            math.log(shares[c.name] / (1 - shares[c.name]))
            if c.transform == "logit"
            else math.log(basis[c.name] * shares[c.name])
            for c in CONSTANTS
        ]
    )


def synthetic_rows(shares: dict[str, dict[str, float]], noise: float) -> list[CalibrationRow]:
    """Step times the model itself makes with ``shares`` (per GPU), off by ``noise``."""
    rng = random.Random(0)
    rows = []
    for name, own in shares.items():
        hardware = CATALOG[name]
        for world in (8, 16):
            topology = Topology(world, 8, "bf16")
            u = _u(own, name, "bf16")
            for stage in range(4):
                for micro in (1, 2, 4, 8):
                    counts = step_counts(GPT2_LARGE, StepShape(stage, micro), topology)
                    seconds = float(step_seconds(u, np.array([counts]))[0])
                    rows.append(
                        CalibrationRow(
                            f"{name}-{world}",
                            hardware,
                            "bf16",
                            tuple(counts),
                            seconds * math.exp(rng.gauss(0, noise)),
                        )
                    )
    return rows


def test_the_fit_finds_each_gpus_compute_share_and_the_misfit_left() -> None:
    calibrated = calibrated_ratios("a100-80gb", "bf16")
    assert calibrated is not None
    common = dict(calibrated.ratios)
    truth = {
        "a100-80gb": {**common, "flop_rate": 0.6},
        "h100-80gb": {**common, "flop_rate": 0.4},
    }
    result = calibrate(synthetic_rows(truth, noise=0.02))
    assert result["flop_rate"]["a100-80gb/half"] == pytest.approx(0.6, rel=0.1)
    assert result["flop_rate"]["h100-80gb/half"] == pytest.approx(0.4, rel=0.1)
    assert 0.005 < result["misfit"] < 0.05  # the noise, not more
    noisy = calibrate(synthetic_rows(truth, noise=0.2))
    assert noisy["misfit"] > 3 * result["misfit"]


def test_a_plan_from_the_datasheet_doubts_by_the_calibrations_misfit() -> None:
    prior = prior_for(CATALOG["v100-32gb"], Topology(16, 16, "fp16"))
    assert prior.calibrated
    (prediction,) = CostModel.from_prior(prior).predict(
        [step_counts(GPT2_LARGE, StepShape(1, 3), Topology(16, 16, "fp16"))], ["z1"]
    )
    assert prediction.sd == pytest.approx(prior.misfit)
    # 80% of the calibration rows within 1.28 misfits: an interval of well under 2x, not 15x.
    assert math.exp(2 * 1.2816 * prior.misfit) < 2.0


def test_stage_3_and_stage_2_cost_what_a_gpu_shows_where_the_model_fits_without_them() -> None:
    topology = Topology(16, 16, "fp16")
    model = CostModel.from_prior(prior_for(CATALOG["v100-32gb"], topology))
    shapes = [StepShape(stage, 3, reduce_bucket_size=5e8) for stage in range(4)]
    rows = [step_counts(GPT2_LARGE, s, topology) for s in shapes]
    latency = [p.latency_s for p in model.predict(rows, [f"z{s}" for s in range(4)])]
    assert latency[2] > 1.02 * latency[1]  # a hook per gradient tensor every micro-step
    assert latency[3] > 1.05 * latency[1]  # a fetch per module and pass, and its latency
    # ... and the per-module cost weighs most on small micro-batches.
    big = [step_counts(GPT2_LARGE, StepShape(s, 30), topology) for s in (1, 3)]
    z1, z3 = (p.latency_s for p in model.predict(big, ["z1", "z3"]))
    assert z3 / z1 < latency[3] / latency[1]


def test_a_gpu_without_published_tables_borrows_the_mean_share_with_more_doubt() -> None:
    known = calibrated_ratios("h100-80gb", "bf16")
    unknown = calibrated_ratios("b200", "bf16")
    assert known is not None and unknown is not None
    assert unknown.misfit > known.misfit
    assert tuple(unknown.ratios) == NAMES


def test_the_published_llama_memory_rows_are_cited_and_held_out() -> None:
    from autotune.bench.published import (
        LLAMA_MEMORY,
        deepspeed_tables,
        llama_memory_rows,
        llama_sources,
        mpt_rows,
    )

    rows, sources = llama_memory_rows(), llama_sources()
    assert rows and json.loads(LLAMA_MEMORY.read_text())["role"] == "held-out"
    for row in rows:
        source = sources[row.source]
        assert source["url"].startswith("https://") and source["setting"] and source["memory"]
        assert row.memory_gib is None or 0 < row.memory_gib < 200
    # Nothing of it is calibrated on: the calibration's rows are DeepSpeed's and MPT's tables.
    calibrated = {t.name for t in deepspeed_tables("calibration")}
    calibrated |= {r.table for r in mpt_rows("calibration")}
    assert calibrated and calibrated.isdisjoint({r.source for r in rows})


def test_a_published_llama_row_is_planned_at_its_stage_size_and_checkpointing() -> None:
    from autotune.bench.published import llama_memory_rows
    from autotune.config import load_config

    row = next(r for r in llama_memory_rows() if r.engine == "deepspeed")
    config = load_config(row.config(), row.shards)
    assert config.zero_optimization.stage == row.zero_stage
    assert config.search_space["train_micro_batch_size_per_gpu"] == (row.micro_batch,)
    assert config.gradient_accumulation_steps == row.grad_accum
    assert config.activation_checkpointing.enabled is row.activation_checkpointing
    assert config.precision == "bf16" and config.autotuning.engine.value == "deepspeed"


@pytest.mark.parametrize("landscape", GPU_LANDSCAPES, ids=lambda landscape: landscape.name[:8])
def test_the_h200_landscapes_lie_inside_the_plans_interval_and_its_fits_are_safe(
    landscape: GpuLandscape,
) -> None:
    """Held out: nothing was fitted on the H200. The plan must bracket what it measured and
    never call fitting a size that did not fit (it may stop short, by a quarter at most: it
    keeps a margin)."""
    report = landscape_report(landscape)
    covered = [point["covered"] for point in report["points"]]
    assert len(covered) >= 24 and sum(covered) >= 0.9 * len(covered)
    for checkpointed, plan in report["largest_fit"].items():
        measured = report["measured_largest_fit"][checkpointed]
        assert all(p <= m for p, m in zip(plan, measured, strict=True)), (plan, measured)
        assert all(p >= 0.75 * m for p, m in zip(plan, measured, strict=True)), (plan, measured)
