"""The samplers on their own, and the order in which each tuner searches the variants."""

from __future__ import annotations

from autotune.config import load_config
from autotune.tuner import OptunaSampler, Point, RandomSampler, Subspace, build_space
from autotune.tuner.prior import variant_order
from tests.tuner.landscape import MODEL

SPACE = [
    Subspace("small", (("a", (1, 2)),)),
    Subspace("large", (("b", (1, 2, 3, 4)), ("c", (True, False)), ("d", (5, 6)))),
]


def test_points_before_the_model_are_the_random_order_not_one_variant_at_a_time() -> None:
    # Optuna's own start-up draws the variant first: "small" (2 points) would get half the
    # tries. The random order draws points, so "large" (16 points) gets its share.
    sampler = OptunaSampler(SPACE, seed=5, num_random=6)
    order = RandomSampler(SPACE, seed=5)
    run: set[Point] = set()
    for _ in range(6):
        point = sampler.ask(lambda p: p not in run)
        assert point is not None and point == order.ask(lambda p: p not in run)
        run.add(point)
        sampler.tell(point, score=float(len(run)))
    proposed = sampler.ask(lambda p: p not in run)  # now the model's, still an open point
    assert proposed is not None and proposed not in run


def test_a_variant_clearly_behind_waits_until_the_contenders_had_their_start_up() -> None:
    behind = [
        Subspace("small", SPACE[0].dims, best_so_far=100.0),
        Subspace("large", SPACE[1].dims, best_so_far=70.0),  # 30% behind: deferred
    ]
    sampler = OptunaSampler(behind, seed=5, num_random=6)
    run: set[Point] = set()
    labels = []
    for _ in range(3):
        point = sampler.ask(lambda p: p not in run)
        assert point is not None
        run.add(point)
        labels.append(point.label)
        sampler.tell(point, score=1.0)
    assert labels == ["small", "small", "large"]  # both of small's points, then large's
    close = [Subspace("small", SPACE[0].dims, 100.0), Subspace("large", SPACE[1].dims, 90.0)]
    first = OptunaSampler(close, seed=5).ask(lambda p: True)
    assert first == RandomSampler(SPACE, seed=5).ask(lambda p: True)  # within noise: as before


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


def test_what_practice_recommends_comes_first_the_best_variants_first() -> None:
    recommended = {s.label: s.points()[-1] for s in SPACE}
    space = [
        Subspace(s.label, s.dims, best_so_far=score, preferred=recommended[s.label])
        for s, score in zip(SPACE, (90.0, 100.0), strict=True)
    ]
    sampler = OptunaSampler(space, seed=5)
    run: list[Point] = []
    for _ in range(2):
        point = sampler.ask(lambda p: p not in run)
        assert point is not None
        run.append(point)
    assert run == [recommended["large"], recommended["small"]]  # the best-scored first
    # RandomSampler (the random tuner) knows nothing of recommendations.
    assert RandomSampler(space, seed=5).ask(lambda p: True) == RandomSampler(SPACE, 5).ask(
        lambda p: True
    )


def test_at_equal_micro_batch_the_prior_puts_the_lower_stage_first() -> None:
    # A generous budget: every stage fits the largest micro-batch, so the stages tie on size
    # and the less partitioned one (less work per step) goes first.
    raw = {"autotuning": {"max_train_micro_batch_size_per_gpu": 4}}
    config = load_config(raw, 2)
    plans = build_space(config, MODEL, 64 * 2**30).plans
    assert {p.start for p in plans} == {4}
    prior = [p.variant.label for p in variant_order(plans, "model_based", 0, MODEL)]
    assert prior == ["z0", "z1", "z2", "z3"]
