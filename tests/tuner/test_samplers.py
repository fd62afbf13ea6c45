"""The samplers on their own, and the order in which each tuner searches the variants."""

from __future__ import annotations

from autotune.config import load_config
from autotune.tuner import build_space
from autotune.tuner.prior import variant_order
from tests.tuner.landscape import MODEL


def test_each_tuner_searches_the_variants_in_its_own_order() -> None:
    # Small buckets: sharding frees memory, so stage 0 has the least room, stage 3 the most,
    # and stage 2 has nearly as much at a third less communication than stage 3.
    raw = {
        "zero_optimization": {"reduce_bucket_size": 10**6, "stage3_max_live_parameters": 10**6},
        "autotuning": {"num_remeasure": 0, "tuner_type": "model_based"},
    }
    config, budget = load_config(raw, 2), 700_000_000
    plans = build_space(config, MODEL, budget).plans
    labels = [p.variant.label for p in plans]
    assert [p.variant.label for p in variant_order(plans, "gridsearch", 0)] == labels
    shuffled = {tuple(p.variant.label for p in variant_order(plans, "random", s)) for s in range(8)}
    assert len(shuffled) > 1  # seeded: each seed its own order
    prior = [p.variant.label for p in variant_order(plans, "model_based", 0, MODEL)]
    assert prior == ["z2", "z1", "z3", "z0"]  # before the cost model knows the workload


def test_at_equal_micro_batch_the_prior_puts_the_lower_stage_first() -> None:
    # A generous budget: every stage fits the largest micro-batch, so the stages tie on size
    # and the less partitioned one (less work per step) goes first.
    raw = {"autotuning": {"max_train_micro_batch_size_per_gpu": 4}}
    config = load_config(raw, 2)
    plans = build_space(config, MODEL, 64 * 2**30).plans
    assert {p.start for p in plans} == {4}
    prior = [p.variant.label for p in variant_order(plans, "model_based", 0, MODEL)]
    assert prior == ["z0", "z1", "z2", "z3"]
