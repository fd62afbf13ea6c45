"""DeepSpeed's leniency where it is harmless, strictness where a typo would change training.

Unknown top-level keys are kept and warned about once; a near-miss of a section name, and an
unknown key inside a typed section, are errors naming the key. Every shipped config and every
config shown in the README or a docs page loads.
"""

from __future__ import annotations

import json
import re
import warnings
from pathlib import Path
from typing import Any

import pytest

from autotune.config import ConfigError, ConfigWarning, errors, load_config

ROOT = Path(__file__).resolve().parents[2]
# Tests that check a warning record it themselves; elsewhere the foreign keys' warnings are noise.
pytestmark = pytest.mark.filterwarnings("ignore::autotune.config.ConfigWarning")

# Shaped like DeepSpeedExamples' configs (cifar/ds_config.json, bing_bert, Megatron-LM),
# with the foreign top-level keys real configs carry.
CIFAR_LIKE: dict[str, Any] = {
    "train_batch_size": 16,
    "steps_per_print": 2000,
    "optimizer": {
        "type": "Adam",
        "params": {"lr": 0.001, "betas": [0.8, 0.999], "eps": 1e-8, "weight_decay": 3e-7},
    },
    "scheduler": {
        "type": "WarmupLR",
        "params": {"warmup_min_lr": 0, "warmup_max_lr": 0.001, "warmup_num_steps": 1000},
    },
    "gradient_clipping": 1.0,
    "prescale_gradients": False,
    "fp16": {
        "enabled": True,
        "fp16_master_weights_and_grads": False,
        "loss_scale": 0,
        "loss_scale_window": 500,
        "hysteresis": 2,
        "min_loss_scale": 1,
        "initial_scale_power": 15,
    },
    "wall_clock_breakdown": False,
    "zero_optimization": {
        "stage": 2,
        "allgather_partitions": True,
        "reduce_scatter": True,
        "allgather_bucket_size": 50000000,
        "reduce_bucket_size": 50000000,
        "overlap_comm": True,
        "contiguous_gradients": True,
    },
    "cuda_visible_devices": 0,
}
MEGATRON_LIKE: dict[str, Any] = {
    "train_batch_size": 16,
    "gradient_accumulation_steps": 1,
    "steps_per_print": 1,
    "zero_optimization": {"stage": 3, "stage3_max_live_parameters": 1e9},
    "optimizer": {"type": "Adam", "params": {"lr": 0.00015}},
    "gradient_clipping": 1.0,
    "fp16": {"enabled": True, "loss_scale": 0, "loss_scale_window": 1000, "hysteresis": 2},
    "activation_checkpointing": {"partition_activations": True},
    "zero_allow_untested_optimizer": True,
    "wall_clock_breakdown": False,
    "timers": {"throughput": {"enabled": True}},
    "compile": {"deepcompile": False},
    "gradient_clip": 1.0,
}


@pytest.fixture(autouse=True)
def fresh_warnings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(errors, "_warned", set())


def _load_warned(config: dict[str, Any]) -> tuple[Any, list[str]]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        loaded = load_config(config, world_size=2)
    return loaded, [str(w.message) for w in caught if issubclass(w.category, ConfigWarning)]


def test_foreign_top_level_keys_are_kept_and_warned_about() -> None:
    config, messages = _load_warned(MEGATRON_LIKE)
    assert config.zero_optimization.stage == 3 and config.train_micro_batch_size_per_gpu == 8
    assert config.foreign_keys == {
        "timers": {"throughput": {"enabled": True}},
        "compile": {"deepcompile": False},
        "gradient_clip": 1.0,
    }
    assert len(messages) == 3 and all("kept but not used" in m for m in messages)
    assert "did you mean 'gradient_clipping'" in next(m for m in messages if "gradient_clip'" in m)
    # Kept: written back out (e.g. into ds_config_optimal.json) and loaded again unchanged.
    again, messages_again = _load_warned(config.to_dict())
    assert again.foreign_keys == config.foreign_keys
    assert messages_again == []  # once per key per process


def test_a_cifar_shaped_config_loads() -> None:
    config, messages = _load_warned(CIFAR_LIKE)
    assert config.fp16.enabled is True and config.zero_optimization.reduce_bucket_size == 5e7
    assert messages == ["config key 'cuda_visible_devices' is unknown; kept but not used"]
    assert config.with_overrides({"zero_optimization.stage": 1}).foreign_keys == {
        "cuda_visible_devices": 0
    }


def test_the_cifar_examples_bf16_config_loads() -> None:
    """DeepSpeedExamples' training/cifar/ds_config.json today: bf16 on, its section with
    fp16's loss-scale keys (DeepSpeed's bf16 section takes them), ``cpu_offload`` in ZeRO."""
    fp16_keys = {k: v for k, v in CIFAR_LIKE["fp16"].items() if k != "enabled"}
    bf16 = {"enabled": True, "bf16_master_weights_and_grads": False}
    bf16.update({k: v for k, v in fp16_keys.items() if k != "fp16_master_weights_and_grads"})
    zero = {**CIFAR_LIKE["zero_optimization"], "stage": 0, "cpu_offload": False}
    spec = {**CIFAR_LIKE, "bf16": bf16, "fp16": {**CIFAR_LIKE["fp16"], "enabled": False}}
    config, _ = _load_warned({**spec, "zero_optimization": zero})
    assert config.precision == "bf16" and config.bf16.loss_scale_window == 500


def test_overlay_keeps_the_base_and_lets_the_top_win() -> None:
    from autotune.config import overlay

    script = {
        "train_batch_size": 16,
        "fp16": {"enabled": True},
        "zero_optimization": {"stage": 0, "overlap_comm": True},
    }
    candidate = {"train_micro_batch_size_per_gpu": 4, "zero_optimization": {"stage": 2}}
    merged = overlay(script, candidate)
    assert merged == {
        "fp16": {"enabled": True},
        "zero_optimization": {"stage": 2, "overlap_comm": True},
        "train_micro_batch_size_per_gpu": 4,  # the script's train_batch_size is dropped
    }
    assert overlay(script, {"fp16": {"enabled": False}})["train_batch_size"] == 16
    assert script["zero_optimization"]["stage"] == 0  # the inputs are left alone


@pytest.mark.parametrize(
    ("key", "section"),
    [
        ("zero_optimisation", "zero_optimization"),
        ("Zero_Optimization", "zero_optimization"),
        ("optimiser", "optimizer"),
        ("fp_16", "fp16"),
        ("FP16", "fp16"),
        ("schedular", "scheduler"),
        ("bf_16", "bf16"),
        ("activation_checkpointng", "activation_checkpointing"),
    ],
)
def test_near_miss_of_a_section_is_an_error(key: str, section: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_config({**MEGATRON_LIKE, key: {"enabled": True}})
    assert info.value.key_path == key
    assert f"did you mean {section!r}" in info.value.rule


@pytest.mark.parametrize(
    ("config", "key_path"),
    [
        ({"zero_optimization": {"stage": 2, "cuda_visible_devices": 0}}, "zero_optimization"),
        ({"fp16": {"enabled": True, "loss_scale_windw": 100}}, "fp16.loss_scale_windw"),
    ],
)
def test_unknown_keys_inside_typed_sections_stay_errors(
    config: dict[str, Any], key_path: str
) -> None:
    with pytest.raises(ConfigError, match=re.escape(key_path)):
        load_config(config)


def _shipped_configs() -> list[Path]:
    return sorted((ROOT / "configs").glob("*.json"))


def _documented_configs() -> list[tuple[str, dict[str, Any]]]:
    """Every ```json block of the README and of the docs pages, with the file it is in."""
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    return [
        (str(page.relative_to(ROOT)), json.loads(block))
        for page in pages
        for block in re.findall(r"```json\n(.*?)```", page.read_text(), re.S)
    ]


@pytest.mark.parametrize("path", _shipped_configs(), ids=lambda p: p.name)
def test_every_shipped_config_loads(path: Path) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error", ConfigWarning)  # ours carry no foreign keys
        load_config(path, world_size=2)


def test_every_readme_config_loads() -> None:
    blocks = _documented_configs()
    assert blocks, "the README and the docs show at least one config"
    for page, block in blocks:
        try:
            load_config(block, world_size=2)
        except ConfigError as e:
            raise AssertionError(f"a config in {page} does not load: {e}") from e
