"""Every rule breaks with a ConfigError naming the key path and the rule."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from autotune.config import ConfigError, load_config


@pytest.mark.parametrize(
    ("config", "key_path", "rule"),
    [
        ({"fp16": {"enabled": True}, "bf16": {"enabled": True}}, "bf16.enabled", "both"),
        ({"fp16": {"enabled": True}, "amp": {"enabled": True}}, "amp.enabled", "fp16 or bf16"),
        ({"bf16": {"enabled": True}, "amp": {"enabled": True}}, "amp.enabled", "fp16 or bf16"),
        (
            {"amp": {"enabled": True}, "zero_optimization": {"stage": 1}},
            "amp.enabled",
            "not compatible with ZeRO",
        ),
        (
            {"zero_optimization": {"stage": 2, "offload_param": {"device": "cpu"}}},
            "zero_optimization.offload_param",
            "needs ZeRO stage 3",
        ),
        (
            {
                "zero_optimization": {
                    "stage": 2,
                    "offload_optimizer": {"device": "nvme", "nvme_path": "/nvme"},
                }
            },
            "zero_optimization.offload_optimizer.device",
            "NVMe optimizer offload needs ZeRO stage 3",
        ),
        (
            {"zero_optimization": {"stage": 3, "offload_optimizer": {"device": "nvme"}}},
            "zero_optimization.offload_optimizer.nvme_path",
            "required",
        ),
        (
            {"autotuning": {"start_profile_step": 5, "end_profile_step": 4}},
            "autotuning.end_profile_step",
            "must not be less than start_profile_step",
        ),
        ({"train_batch_size": 0}, "train_batch_size", ">= 1"),
        ({"train_micro_batch_size_per_gpu": -2}, "train_micro_batch_size_per_gpu", ">= 1"),
        ({"gradient_accumulation_steps": 0}, "gradient_accumulation_steps", ">= 1"),
        (
            {"zero_optimization": {"reduce_bucket_size": 0}},
            "zero_optimization.reduce_bucket_size",
            ">= 1",
        ),
        (
            {"zero_optimization": {"allgather_bucket_size": -1}},
            "zero_optimization.allgather_bucket_size",
            ">= 1",
        ),
        ({"zero_optimization": {"stage": 4}}, "zero_optimization.stage", "less than or equal to 3"),
        (
            {"zero_optimization": {"reduce_bucket_size": 5.5}},
            "zero_optimization.reduce_bucket_size",
            "integer",
        ),
        (
            {"zero_optimization": {"overlap_comm": "yes"}},
            "zero_optimization.overlap_comm",
            "true, false",
        ),
        (
            {"zero_optimization": {"contiguous_gradients": 1}},
            "zero_optimization.contiguous_gradients",
            "boolean",
        ),
        ({"train_batch_size": True}, "train_batch_size", "integer"),
        ({"train_batch_size": "32"}, "train_batch_size", "integer"),
        ({"gradient_clipping": -1.0}, "gradient_clipping", ">= 0"),
        ({"fp16": {"loss_scale_window": 0}}, "fp16.loss_scale_window", ">= 1"),
        ({"autotuning": {"metric": "speed"}}, "autotuning.metric", "throughput"),
        ({"autotuning": {"tuner_type": "bayes"}}, "autotuning.tuner_type", "gridsearch"),
        ({"optimizer": {"type": "Adamm"}}, "optimizer.type", "unknown optimizer"),
        ({"optimizer": {"params": {}}}, "optimizer.type", "required key is missing"),
        (
            {"optimizer": {"type": "AdamW", "params": {"lr": "fast"}}},
            "optimizer.params.lr",
            "number",
        ),
        (
            {"optimizer": {"type": "Adam", "params": {"betas": [0.9]}}},
            "optimizer.params.betas",
            "too few",
        ),
        ({"scheduler": {"type": "Cosine"}}, "scheduler.type", "WarmupLR"),
        ({"scheduler": {"type": "WarmupDecayLR"}}, "scheduler.params.total_num_steps", "missing"),
        ({"bf16": {"enabled": True}, "bfloat16": {"enabled": True}}, "", "keep one"),
        (
            {"zero_optimization": {"prefetch_bucket_size": 1, "stage3_prefetch_bucket_size": 2}},
            "zero_optimization",
            "keep one",
        ),
        ({"device_memory_bytes": "lots"}, "device_memory_bytes", "size"),
        ({"zero_optimization": []}, "zero_optimization", "valid dictionary"),
    ],
)
def test_rule_violation_names_key_and_rule(
    config: dict[str, Any], key_path: str, rule: str
) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(config)
    assert info.value.key_path == key_path
    assert rule in info.value.rule
    assert str(info.value).startswith(f"{key_path}: " if key_path else info.value.rule)


def test_config_error_is_a_value_error() -> None:
    assert issubclass(ConfigError, ValueError)


@pytest.mark.parametrize(
    ("config", "key_path", "hint"),
    [
        (
            {"zero_optimization": {"reduce_bucket_sise": 1}},
            "zero_optimization.reduce_bucket_sise",
            "reduce_bucket_size",
        ),
        ({"zero_optimisation": {"stage": 1}}, "zero_optimisation", "zero_optimization"),
        ({"fp16": {"initial_scale_pow": 8}}, "fp16.initial_scale_pow", "initial_scale_power"),
        ({"autotuning": {"tuner_num_trial": 8}}, "autotuning.tuner_num_trial", "tuner_num_trials"),
        (
            {"zero_optimization": {"offload_optimizer": {"devise": "cpu"}}},
            "zero_optimization.offload_optimizer.devise",
            "device",
        ),
        (
            {"optimizer": {"type": "AdamW", "params": {"weight_decai": 0.1}}},
            "optimizer.params.weight_decai",
            "weight_decay",
        ),
    ],
)
def test_unknown_key_in_typed_section_suggests_the_right_one(
    config: dict[str, Any], key_path: str, hint: str
) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(config)
    assert info.value.key_path == key_path
    assert "unknown key" in info.value.rule and f"did you mean {hint!r}" in info.value.rule


def test_unknown_key_far_from_any_gives_no_suggestion() -> None:
    with pytest.raises(ConfigError, match=r"^zero_optimization\.xyz: unknown key$"):
        load_config({"zero_optimization": {"xyz": 1}})


def test_stage_dependent_rules_hold_per_candidate_when_stage_is_searched() -> None:
    config = load_config(
        {"zero_optimization": {"stage": [1, 3], "offload_param": {"device": "cpu"}}}
    )
    assert config.with_overrides({"zero_optimization.stage": 3}).zero_optimization.stage == 3
    with pytest.raises(ConfigError, match="needs ZeRO stage 3"):
        config.with_overrides({"zero_optimization.stage": 1})


# --- files -------------------------------------------------------------------------------------


def test_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "nope.json"
    with pytest.raises(ConfigError, match="config file not found") as info:
        load_config(path)
    assert str(path) in str(info.value)


def test_a_directory_is_not_a_config(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="is not a file"):
        load_config(tmp_path)


def test_malformed_json_names_line_and_column(tmp_path: Path) -> None:
    path = tmp_path / "bad.json"
    path.write_text('{\n  "train_batch_size": 8,\n  "fp16": {"enabled": true,}\n}\n')
    with pytest.raises(ConfigError, match=r"malformed JSON at line 3, column 28") as info:
        load_config(path)
    assert str(info.value).startswith(str(path))


def test_duplicate_keys_are_rejected_with_their_path(tmp_path: Path) -> None:
    path = tmp_path / "dup.json"
    path.write_text('{"zero_optimization": {"stage": 1, "overlap_comm": true, "stage": 2}}')
    with pytest.raises(ConfigError, match=r"zero_optimization\.stage: duplicate key"):
        load_config(path)


def test_top_level_must_be_an_object(tmp_path: Path) -> None:
    path = tmp_path / "list.json"
    path.write_text("[1, 2]")
    with pytest.raises(ConfigError, match="must be a JSON object"):
        load_config(path)


def test_errors_from_a_file_name_the_file(tmp_path: Path) -> None:
    path = tmp_path / "c.json"
    path.write_text('{"zero_optimization": {"stage": 9}}')
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert str(info.value).startswith(f"{path}: zero_optimization.stage: ")


def test_world_size_must_be_positive() -> None:
    with pytest.raises(ConfigError, match="world_size"):
        load_config({}, world_size=0)
