"""The model-based sampler on its own: its start-up follows the seeded random order."""

from __future__ import annotations

from autotune.tuner import OptunaSampler, Point, RandomSampler, Subspace

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
