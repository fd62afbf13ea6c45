"""The search space: stages, micro-batches, knobs, memory pruning, names."""

from __future__ import annotations

from typing import Any

import pytest

from autotune.config import load_config
from autotune.tuner import Tuner, build_space, candidate_name
from autotune.tuner.knob_grid import default_knobs, size_grid
from autotune.tuner.space import micro_batch_sizes
from tests.tuner.landscape import MODEL

Z = "zero_optimization."


def space(raw: dict[str, Any], **kwargs: Any) -> Any:
    return build_space(load_config(raw, world_size=2), **kwargs)


def test_all_stages_unless_the_config_sets_one() -> None:
    assert [p.variant.stage for p in space({}).plans] == [0, 1, 2, 3]
    assert [p.variant.stage for p in space({"zero_optimization": {"stage": 2}}).plans] == [2]
    assert [p.variant.stage for p in space({"zero_optimization": {"stage": [3, 1]}}).plans] == [
        1,
        3,
    ]


def test_knobs_per_stage_and_stage_three_skips_the_ones_it_ignores() -> None:
    assert default_knobs(0, None) == {}
    assert set(default_knobs(1, None)) == {Z + "reduce_bucket_size", Z + "allgather_bucket_size"}
    assert {Z + "overlap_comm", Z + "reduce_scatter", Z + "contiguous_gradients"} < set(
        default_knobs(2, None)
    )
    stage3 = set(default_knobs(3, None))
    assert all(k.startswith(Z + "stage3_") for k in stage3) and len(stage3) == 3


def test_fast_tunes_no_knobs_the_user_did_not_list() -> None:
    fast = space({"zero_optimization": {"stage": 2}})
    assert fast.plans[0].knobs == ()
    slow = space({"zero_optimization": {"stage": 2}, "autotuning": {"fast": False}})
    assert len(slow.plans[0].knobs) == 5


def test_user_lists_replace_defaults_and_apply_where_the_engine_reads_them() -> None:
    raw = {"zero_optimization": {"stage": [1, 3], "allgather_bucket_size": [1e6, 1e7]}}
    plans = {p.variant.stage: p for p in space(raw).plans}
    assert plans[1].knobs == ((Z + "allgather_bucket_size", (1_000_000, 10_000_000)),)
    assert plans[3].knobs == ()  # stage 3 never reads allgather_bucket_size
    slow = space({**raw, "autotuning": {"fast": False}})
    assert dict(slow.plans[0].knobs)[Z + "allgather_bucket_size"] == (1_000_000, 10_000_000)


@pytest.mark.filterwarnings("ignore::autotune.config.ConfigWarning")  # tests/config warns
def test_knobs_the_engine_ignores_are_not_tuned_and_sub_groups_are_tuned_everywhere() -> None:
    # round_robin_gradients changes nothing in the engine: its list stays at its first value.
    raw = {
        "zero_optimization": {
            "stage": "all",
            "round_robin_gradients": [True, False],
            "sub_group_size": [1e6, 1e9],
        }
    }
    tuned = space(raw)
    for plan in tuned.plans:
        assert plan.knobs == ((Z + "sub_group_size", (1_000_000, 1_000_000_000)),)
    assert tuned.fixed[Z + "round_robin_gradients"] is True


def test_the_default_knob_grid_and_its_names() -> None:
    # The landscapes in results/landscapes were measured on exactly these names.
    slow = space({"autotuning": {"fast": False}}, model_info=MODEL)
    plans = {p.variant.stage: p for p in slow.plans}
    # Fitted to the 20M-parameter model: the largest size is the config's own (it holds the
    # whole model, as the grid's would), so that point is the micro-batch phase's.
    sizes = (1_000_000, 5_000_000, 500_000_000)
    assert plans[0].knobs == ()
    assert plans[1].knobs == (
        (Z + "reduce_bucket_size", sizes),
        (Z + "allgather_bucket_size", sizes),
    )
    switches = (True, False)
    assert plans[2].knobs == (
        *plans[1].knobs,
        (Z + "overlap_comm", switches),
        (Z + "reduce_scatter", switches),
        (Z + "contiguous_gradients", switches),
    )
    assert plans[3].knobs == (
        (Z + "stage3_prefetch_bucket_size", (1_000_000, 5_000_000, 50_000_000)),
        (Z + "stage3_param_persistence_threshold", (10_000, 100_000, 1_000_000)),
        (Z + "stage3_max_live_parameters", (1_000_000, 5_000_000, 1_000_000_000)),
    )
    stage2 = {
        Z + "reduce_bucket_size": 1_000_000,
        Z + "allgather_bucket_size": 5_000_000,
        Z + "overlap_comm": True,
        Z + "reduce_scatter": False,
        Z + "contiguous_gradients": False,
    }
    name = slow.name(slow.overrides(plans[2].variant, 4, stage2))
    assert name == "z2_mbs4_rbs1e6_agbs5e6_oc1_rs0_cg0"
    stage3 = {
        Z + "stage3_max_live_parameters": 1_000_000,
        Z + "stage3_prefetch_bucket_size": 5_000_000,
        Z + "stage3_param_persistence_threshold": 10_000,
    }
    assert slow.name(slow.overrides(plans[3].variant, 4, stage3)) == "z3_mbs4_pfb5e6_ppt1e4_mlp1e6"


def test_sizes_above_the_model_collapse_into_one() -> None:
    assert size_grid(10**10, (5 * 10**7, 5 * 10**8)) == (5 * 10**7, 5 * 10**8)
    assert size_grid(20_000_000, (50_000_000, 500_000_000, 10**9)) == (
        1_000_000,
        5_000_000,
        20_000_000,
    )


def test_micro_batches_keep_a_fixed_global_batch() -> None:
    sizes, chosen = micro_batch_sizes(load_config({"train_batch_size": 24}, world_size=2))
    assert sizes == (1, 2, 3, 4, 6, 12) and not chosen
    sizes, chosen = micro_batch_sizes(load_config({"train_micro_batch_size_per_gpu": 4}, 2))
    assert sizes == (4,) and chosen
    capped = load_config({"autotuning": {"max_train_batch_size": 16}}, world_size=2)
    assert micro_batch_sizes(capped)[0][-1] == 8


def test_accumulation_is_derived_to_keep_the_global_batch() -> None:
    config = load_config({"train_batch_size": 48, "zero_optimization": {"stage": 1}}, 2)
    tuner = Tuner(config, MODEL, device_memory_bytes=600_000_000)
    candidate = tuner.ask()
    assert candidate is not None
    ds = candidate.ds_config
    assert ds["train_batch_size"] == 48
    assert ds["train_micro_batch_size_per_gpu"] * ds["gradient_accumulation_steps"] * 2 == 48


def test_memory_prunes_stages_that_cannot_fit_and_offloads_when_that_fits() -> None:
    # 20M parameters: states take 320 MB (stage 0), 240 MB (stage 1), 200 MB, 160 MB per rank.
    pruned = space({}, model_info=MODEL, device_memory_bytes=330_000_000)
    labels = [p.variant.label for p in pruned.plans]
    assert "z0" in pruned.pruned and "z0" not in labels
    assert "exceeds" in pruned.pruned["z0"] and "micro-batch 1" in pruned.pruned["z0"]
    assert labels == ["z1", "z2", "z3"]
    tight = space({}, model_info=MODEL, device_memory_bytes=220_000_000)
    # Stage 1 does not fit even offloaded (its parameters and gradients stay: 160 + 40 MB).
    assert [p.variant.label for p in tight.plans] == ["z2_ocpu", "z3_ocpu"]
    assert "offloading instead" in tight.pruned["z2"] and "z1" in tight.pruned
    candidate = Tuner(load_config({}, 2), MODEL, device_memory_bytes=220_000_000).ask()
    assert candidate is not None and candidate.name.startswith("z2_ocpu_mbs")
    assert candidate.ds_config["zero_optimization"]["offload_optimizer"] == {"device": "cpu"}


def test_the_search_starts_at_the_estimated_largest_fit() -> None:
    plan = space({"zero_optimization": {"stage": 3}}, model_info=MODEL, device_memory_bytes=10**9)
    start = plan.plans[0].start
    assert plan.plans[0].estimate is not None
    assert plan.plans[0].estimate.fits(start) and not plan.plans[0].estimate.fits(start + 1)


def test_names_are_readable_safe_and_only_show_what_changed() -> None:
    base = {Z + "overlap_comm": False, Z + "reduce_bucket_size": 500_000_000}
    overrides = {
        Z + "stage": 2,
        "train_micro_batch_size_per_gpu": 4,
        Z + "reduce_bucket_size": 500_000_000,
        Z + "overlap_comm": True,
        Z + "offload_optimizer.device": "cpu",
    }
    assert candidate_name(overrides, base) == "z2_ocpu_mbs4_oc1"


def test_a_checkpointing_list_makes_variants_with_their_own_largest_micro_batch() -> None:
    from autotune.profiling.model_info import ModelInfo

    info = ModelInfo(
        num_params=10**6,
        param_bytes=4 * 10**6,
        activation_bytes_per_sample=10**6,
        flops_per_sample=1e9,
        checkpointed_activation_bytes_per_sample=2 * 10**5,
    )
    config = load_config(
        {"zero_optimization": {"stage": 1}, "activation_checkpointing": {"enabled": [True, False]}},
        2,
    )
    space = build_space(config, info, 10**8)
    plans = {plan.variant.activation_checkpointing: plan for plan in space.plans}
    assert [p.variant.label for p in space.plans] == ["z1", "z1_ac"]  # off first
    assert plans[True].start > 3 * plans[False].start
    overrides = space.overrides(plans[True].variant, 4)
    assert overrides["activation_checkpointing.enabled"] is True
    assert space.name(overrides) == "z1_mbs4_ac1"
    assert "activation_checkpointing.enabled" not in space.overrides(plans[False].variant, 4)
