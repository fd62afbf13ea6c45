"""A Config records how it was loaded, so overrides keep what the user wrote; dotted keys are
walked in one place; the config modules import one another in one direction only."""

from __future__ import annotations

import ast
import graphlib
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from autotune.config import (
    Config,
    ConfigError,
    DeepSpeedConfig,
    ZeroConfig,
    load_config,
    set_key,
)
from autotune.config.keys import (
    MISSING,
    get_field,
    get_key,
    known_keys,
    nested,
    parent_of,
    spellings,
    walk,
)
from autotune.config.overrides import overridden

CONFIG_PACKAGE = Path(__file__).resolve().parents[2] / "autotune" / "config"


def test_a_config_is_never_made_without_what_the_user_wrote() -> None:
    # It once was: Config(...) had an empty spec and world size 1, and with_overrides then
    # re-loaded that empty spec, silently dropping the user's stage 2 and fp16.
    with pytest.raises(ValidationError) as err:
        Config(zero_optimization={"stage": 2}, fp16={"enabled": True})  # type: ignore[call-arg]
    missing = {e["loc"][0] for e in err.value.errors() if e["type"] == "missing"}
    assert missing == {"spec", "search_space", "world_size", "foreign_keys"}
    with pytest.raises(ValidationError):
        Config.model_validate({"zero_optimization": {"stage": 2}})

    loaded = load_config({"zero_optimization": {"stage": 2}, "fp16": {"enabled": True}}, 2)
    by_hand = Config(**dict(loaded))  # the sections and the record of how they were loaded
    assert by_hand == loaded
    assert by_hand.with_overrides({"train_micro_batch_size_per_gpu": 4}).precision == "fp16"
    with pytest.raises(ValidationError, match="make a Config with load_config"):
        Config(**{**dict(loaded), "zero_optimization": ZeroConfig(stage=3)})


def test_overrides_keep_every_key_the_user_wrote_and_the_world_size() -> None:
    user = {
        "train_batch_size": 32,
        "fp16": {"enabled": True},
        "zero_optimization": {"stage": 2, "max_live_parameters": 5, "overlap_comm": True},
        "cuda_visible_devices": 0,
    }
    with pytest.warns(UserWarning, match="cuda_visible_devices"):
        config = load_config(user, world_size=4)
    assert (config.train_micro_batch_size_per_gpu, config.gradient_accumulation_steps) == (8, 1)
    changed = config.with_overrides(
        {"train_micro_batch_size_per_gpu": 2, "zero_optimization.stage3_max_live_parameters": 7}
    )
    assert changed.world_size == 4
    assert (changed.train_batch_size, changed.gradient_accumulation_steps) == (32, 4)
    assert changed.fp16.enabled is True and changed.zero_optimization.overlap_comm is True
    assert changed.zero_optimization.stage == 2
    assert changed.zero_optimization.stage3_max_live_parameters == 7  # the alias was replaced
    assert changed.foreign_keys == {"cuda_visible_devices": 0}
    assert config.spec == user  # the original is untouched


def test_the_loading_record_is_not_a_config_key() -> None:
    with pytest.warns(UserWarning):
        config = load_config({"world_size": 8, "spec": {}, "train_batch_size": 8}, world_size=2)
    assert config.world_size == 2 and config.train_micro_batch_size_per_gpu == 4
    assert config.foreign_keys == {"world_size": 8, "spec": {}}  # kept, as any unknown key
    written = config.to_dict(full=True)
    assert written["world_size"] == 8 and "search_space" not in written
    assert "foreign_keys" not in written and written["spec"] == {}


def test_search_lists_at_any_spelling_are_written_back_by_name() -> None:
    user = {"zero_optimization": {"stage": [1, 2], "max_reuse_distance": [0, 10]}}
    config = load_config(user, world_size=2)
    assert config.search_space == {
        "zero_optimization.stage": (1, 2),
        "zero_optimization.stage3_max_reuse_distance": (0, 10),
    }
    written = config.to_dict()["zero_optimization"]
    assert written == {"stage": [1, 2], "stage3_max_reuse_distance": [0, 10]}
    assert load_config(config.to_dict(), world_size=2) == config
    clash = {"zero_optimization": {"max_reuse_distance": [0, 1], "stage3_max_reuse_distance": 5}}
    with pytest.raises(ConfigError, match="both set"):
        load_config(clash)


def test_overridden_leaves_its_input_alone_and_anchors_the_triad() -> None:
    spec: dict[str, Any] = {"gradient_accumulation_steps": 2, "zero_optimization": {"stage": 1}}
    result = overridden(spec, {"zero_optimization.stage": 3, "train_micro_batch_size_per_gpu": 4})
    assert result == {
        "gradient_accumulation_steps": 2,
        "train_micro_batch_size_per_gpu": 4,
        "zero_optimization": {"stage": 3},
    }
    assert spec == {"gradient_accumulation_steps": 2, "zero_optimization": {"stage": 1}}


def test_set_key_makes_sections_and_drops_other_spellings() -> None:
    spec: dict[str, Any] = {"zero_optimization": 0, "bf16": {"enabled": True}}
    set_key(spec, "zero_optimization.stage3_prefetch_bucket_size", 10)
    assert spec["zero_optimization"] == {"stage3_prefetch_bucket_size": 10}
    spec["zero_optimization"]["prefetch_bucket_size"] = 20
    set_key(spec, "zero_optimization.stage3_prefetch_bucket_size", 30)
    assert spec["zero_optimization"] == {"stage3_prefetch_bucket_size": 30}


def test_one_walk_serves_dicts_objects_and_the_schema() -> None:
    tree = {"zero_optimization": {"stage": 2, "offload_optimizer": None}, "fp16": 1}
    assert get_key(tree, "zero_optimization.stage") == 2
    assert get_key(tree, "zero_optimization.offload_optimizer", "absent") is None
    assert get_key(tree, "fp16.enabled", "absent") == "absent"  # through a non-dict
    assert walk(tree, "") is tree and walk(tree, "bf16.enabled") is MISSING
    assert parent_of(tree, "bf16.enabled") == (None, "enabled")
    assert nested("a.b.c", 1) == {"a": {"b": {"c": 1}}}

    config = load_config({"zero_optimization": {"stage": 3}})
    assert get_field(config, "zero_optimization.stage") == 3
    assert get_field(config, "gradient_clipping") == 0.0
    with pytest.raises(AttributeError, match=r"zero_optimization\.stag"):
        get_field(config, "zero_optimization.stag")

    assert "max_live_parameters" in known_keys(DeepSpeedConfig, "zero_optimization")
    assert known_keys(DeepSpeedConfig, "zero_optimization.stage") == ()  # not a section
    assert spellings("bf16") == ("bf16", "bfloat16")
    assert spellings("zero_optimization.stage") == ("stage",)


def test_config_modules_import_one_another_in_one_direction() -> None:
    # The schema first, the loader last: a model never reaches back into what loads it.
    graph: dict[str, set[str]] = {}
    for path in CONFIG_PACKAGE.glob("*.py"):
        if path.stem == "__init__":
            continue
        imported = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                prefix = "autotune.config."
                if node.module.startswith(prefix):
                    imported.add(node.module.removeprefix(prefix))
        graph[path.stem] = imported
    assert {"schema", "loader", "overrides", "keys"} <= graph.keys()
    order = list(graphlib.TopologicalSorter(graph).static_order())  # raises on a cycle
    assert order.index("schema") < order.index("overrides") < order.index("loader")
