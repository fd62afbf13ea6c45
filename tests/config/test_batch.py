"""The batch triad and search lists."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from autotune.config import ConfigError, load_config, resolve_batch_triad

TRIAD = ("train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps")


def _triad(**given: int) -> tuple[int, int, int]:
    config = load_config(given, world_size=2)
    return tuple(getattr(config, k) for k in TRIAD)  # type: ignore[return-value]


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ((32, 16, 1), (32, 16, 1)),
        ((32, 8, 2), (32, 8, 2)),
        ((32, 8, None), (32, 8, 2)),
        ((32, None, 2), (32, 8, 2)),
        ((None, 8, 2), (32, 8, 2)),
        ((None, 16, None), (32, 16, 1)),
        ((64, None, None), (64, 32, 1)),
    ],
)
def test_any_two_infer_the_third_at_world_size_2(
    given: tuple[int | None, ...], expected: tuple[int, int, int]
) -> None:
    assert _triad(**{k: v for k, v in zip(TRIAD, given, strict=True) if v is not None}) == expected


@pytest.mark.parametrize(
    "given",
    [(33, 17, 2), (32, 18, 1), (33, 4, None), (32, None, 3), (33, None, None)],
)
def test_inconsistent_triads_are_rejected(given: tuple[int | None, ...]) -> None:
    with pytest.raises(ConfigError) as info:
        _triad(**{k: v for k, v in zip(TRIAD, given, strict=True) if v is not None})
    assert info.value.key_path == "train_batch_size"


def test_only_train_batch_size_64_gives_micro_32_and_no_accumulation() -> None:
    for total in range(2, 130, 2):
        config = load_config({"train_batch_size": total}, world_size=2)
        hit = (config.train_micro_batch_size_per_gpu, config.gradient_accumulation_steps) == (32, 1)
        assert hit == (total == 64)


def test_an_open_triad_is_left_to_the_tuner() -> None:
    config = load_config({"gradient_accumulation_steps": 4}, world_size=2)
    assert config.train_micro_batch_size_per_gpu is None and not config.is_concrete


@given(
    micro=st.integers(1, 64),
    accumulation=st.integers(1, 16),
    world_size=st.integers(1, 16),
    which=st.sampled_from([(0, 1), (0, 2), (1, 2), (0, 1, 2), (1,)]),
)
def test_valid_triads_resolve_and_round_trip(
    micro: int, accumulation: int, world_size: int, which: tuple[int, ...]
) -> None:
    full = (micro * accumulation * world_size, micro, accumulation)
    if which == (1,):
        full = (micro * world_size, micro, 1)
    given_keys = {TRIAD[i]: full[i] for i in which}
    config = load_config(given_keys, world_size=world_size)
    assert tuple(getattr(config, k) for k in TRIAD) == full
    assert config.is_concrete
    assert load_config(config.to_dict(), world_size=world_size) == config
    assert resolve_batch_triad(*full, world_size=world_size) == full


# --- search lists ------------------------------------------------------------------------------


def test_lists_at_searchable_keys_become_the_search_space() -> None:
    config = load_config(
        {
            "train_micro_batch_size_per_gpu": [2, 4, 8],
            "zero_optimization": {"stage": [1, 2], "reduce_bucket_size": [5e7, 5e8]},
        },
        world_size=2,
    )
    assert config.search_space == {
        "train_micro_batch_size_per_gpu": (2, 4, 8),
        "zero_optimization.stage": (1, 2),
        "zero_optimization.reduce_bucket_size": (50_000_000, 500_000_000),
    }
    assert not config.is_concrete
    assert load_config(config.to_dict(), world_size=2) == config


def test_stage_all_means_every_stage() -> None:
    config = load_config({"zero_optimization": {"stage": "all"}})
    assert config.search_space == {"zero_optimization.stage": (0, 1, 2, 3)}


def test_search_values_are_validated_one_by_one() -> None:
    with pytest.raises(ConfigError) as info:
        load_config({"zero_optimization": {"stage": [1, 5]}})
    assert info.value.key_path == "zero_optimization.stage[1]"
    with pytest.raises(ConfigError, match="empty list"):
        load_config({"train_micro_batch_size_per_gpu": []})


def test_repeated_search_values_count_once() -> None:
    config = load_config({"zero_optimization": {"reduce_bucket_size": [5e8, 500000000]}})
    assert config.search_space["zero_optimization.reduce_bucket_size"] == (500_000_000,)


def test_a_list_at_a_non_searchable_key_is_an_error() -> None:
    with pytest.raises(ConfigError, match="tunable keys") as info:
        load_config({"train_batch_size": [8, 16]})
    assert info.value.key_path == "train_batch_size"


# --- overriding keys to make an experiment's config -------------------------------------------


def test_overrides_keep_everything_else_the_user_set() -> None:
    base = load_config(
        {
            "train_micro_batch_size_per_gpu": [2, 4],
            "optimizer": {"type": "Lamb", "params": {"lr": 0.01}},
            "bf16": {"enabled": True},
            "zero_optimization": {
                "stage": [1, 2, 3],
                "offload_optimizer": {"device": "cpu"},
                "prefetch_bucket_size": 123,
            },
            "wandb": {"enabled": True, "project": "x"},
        },
        world_size=2,
    )
    candidate = base.with_overrides(
        {
            "train_micro_batch_size_per_gpu": 4,
            "zero_optimization.stage": 3,
            "zero_optimization.stage3_prefetch_bucket_size": 456,
        }
    )
    assert candidate.is_concrete and candidate.train_batch_size == 8
    assert candidate.optimizer is not None and candidate.optimizer.type == "Lamb"
    assert candidate.precision == "bf16" and candidate.wandb == {"enabled": True, "project": "x"}
    zero = candidate.zero_optimization
    assert zero.offload_optimizer is not None and zero.offload_optimizer.device.value == "cpu"
    assert zero.stage3_prefetch_bucket_size == 456


def test_overriding_micro_batch_keeps_a_fixed_global_batch() -> None:
    base = load_config({"train_batch_size": 32, "train_micro_batch_size_per_gpu": 16}, 2)
    candidate = base.with_overrides({"train_micro_batch_size_per_gpu": 4})
    assert (candidate.train_batch_size, candidate.gradient_accumulation_steps) == (32, 4)


def test_overriding_micro_batch_keeps_the_users_accumulation() -> None:
    base = load_config({"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 3}, 2)
    candidate = base.with_overrides({"train_micro_batch_size_per_gpu": 4})
    assert (candidate.train_batch_size, candidate.gradient_accumulation_steps) == (24, 3)


def test_overriding_with_an_impossible_micro_batch_is_an_error() -> None:
    base = load_config({"train_batch_size": 32}, world_size=2)
    with pytest.raises(ConfigError, match="not divisible"):
        base.with_overrides({"train_micro_batch_size_per_gpu": 3})
