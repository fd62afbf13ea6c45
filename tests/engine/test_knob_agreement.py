"""The knob table agrees with the engine: each knob changes what the engine does at exactly
the stages its row lists (a collective count, a bucket, a memory figure), and nothing at the
others, where tuning it would only measure noise."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from autotune.config import set_key
from autotune.config.knobs import ALL_STAGES, KNOBS, Knob
from tests.engine import engine_cases as cases
from tests.engine.rank_pool import RankPool

pytestmark = pytest.mark.multirank

# Per tuned knob: its value in every stage's baseline, then the value it is changed to. Both
# must differ in effect on engine_cases' TinyNet (2,209 parameters, 33 to 1,024 per tensor).
# Sizes are the ends of the knob's default grid fitted to that model (200 and 5,000); the
# persistence threshold's grid is not fitted (10,000 and up keep every TinyNet parameter
# whole), so its baseline is 0, which makes stage 3 gather every module.
PROBES: dict[str, tuple[Any, Any]] = {
    "gradient_accumulation_steps": (1, 2),
    "zero_optimization.reduce_bucket_size": (200, 5_000),
    "zero_optimization.allgather_bucket_size": (200, 5_000),
    "zero_optimization.overlap_comm": (True, False),
    "zero_optimization.reduce_scatter": (True, False),
    "zero_optimization.contiguous_gradients": (True, False),
    "zero_optimization.allgather_partitions": (True, False),
    "zero_optimization.round_robin_gradients": (False, True),
    "zero_optimization.stage3_prefetch_bucket_size": (5_000, 200),
    "zero_optimization.stage3_param_persistence_threshold": (0, 10_000),
    "zero_optimization.stage3_max_live_parameters": (5_000, 200),
    "zero_optimization.stage3_max_reuse_distance": (1_000_000_000, 0),
    "zero_optimization.sub_group_size": (1_000_000_000, 100),
}
TUNED = [knob for knob in KNOBS if knob.per_stage]


@pytest.fixture(scope="module")
def pool() -> Iterator[RankPool]:
    ranks = RankPool(world_size=2)
    yield ranks
    ranks.close()


def observe(pool: RankPool, stage: int, changed: dict[str, Any] | None = None) -> list[Any]:
    """What the engine did on each rank in two steps: collectives (all, and during backward),
    peak memory, optimizer tensors, overlapped reductions, stage 3's prefetch and live sizes."""
    config = cases.base_config({"stage": stage})
    for key, (baseline, _) in PROBES.items():
        set_key(config, key, baseline)
    for key, value in (changed or {}).items():
        set_key(config, key, value)
    return pool.run(cases.collectives, config)


@pytest.fixture(scope="module")
def baselines(pool: RankPool) -> dict[int, list[Any]]:
    seen = {stage: observe(pool, stage) for stage in ALL_STAGES}
    # Everything observed is deterministic, so any difference below is the knob's doing.
    assert observe(pool, 3) == seen[3]
    return seen


def test_every_tuned_knob_has_probes() -> None:
    assert set(PROBES) == {knob.key for knob in TUNED}


@pytest.mark.parametrize("knob", TUNED, ids=[knob.abbreviation for knob in TUNED])
def test_a_knob_changes_the_engine_at_exactly_its_stages(
    pool: RankPool, baselines: dict[int, list[Any]], knob: Knob
) -> None:
    changed_value = PROBES[knob.key][1]
    effects = {}
    for stage in ALL_STAGES:
        observed = observe(pool, stage, {knob.key: changed_value})
        effects[stage] = sorted(
            name for name, value in observed[0].items() if baselines[stage][0].get(name) != value
        )
        if observed != baselines[stage] and not effects[stage]:
            effects[stage] = ["(on rank 1 only)"]
    acting = frozenset(stage for stage, names in effects.items() if names)
    assert acting == knob.stages, f"{knob.key} = {changed_value!r} changed {effects}"
