"""load_config: sections, defaults, aliases, "auto", round-trips, files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from autotune.config import (
    Config,
    ConfigError,
    Metric,
    OffloadDevice,
    TunerType,
    load_config,
)

CONFIGS = sorted((Path(__file__).parents[2] / "configs").glob("*.json"))


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_every_example_config_loads_and_round_trips(path: Path) -> None:
    config = load_config(path, world_size=2)
    assert load_config(config.to_dict(), world_size=2) == config
    assert load_config(json.loads(config.to_json()), world_size=2) == config


def test_examples_cover_every_stage_offload_and_autotuning() -> None:
    configs = [load_config(p, world_size=2) for p in CONFIGS]
    stages = {c.zero_optimization.stage for c in configs if not c.search_space}
    assert stages == {0, 1, 2, 3}
    assert any(c.zero_optimization.optimizer_offload_device is OffloadDevice.cpu for c in configs)
    assert any(c.autotuning.enabled for c in configs)


def test_defaults_are_deepspeeds_documented_ones() -> None:
    config = load_config({})
    tuning = config.autotuning
    assert (tuning.metric, tuning.tuner_type) == (Metric.throughput, TunerType.model_based)
    assert (tuning.start_profile_step, tuning.end_profile_step) == (3, 5)
    assert (tuning.fast, tuning.overwrite, tuning.enabled) == (True, False, False)
    assert (tuning.tuner_early_stopping, tuning.tuner_num_trials) == (5, 50)
    assert (tuning.num_tuning_micro_batch_sizes, tuning.mp_size) == (3, 1)
    assert tuning.max_train_batch_size is None and tuning.arg_mappings is None
    assert (tuning.results_dir, tuning.exps_dir) == ("autotuning_results", "autotuning_exps")
    zero = config.zero_optimization
    assert zero.stage == 0 and zero.reduce_bucket_size == 500_000_000
    assert zero.allgather_bucket_size == 500_000_000 and zero.contiguous_gradients
    assert zero.reduce_scatter and zero.allgather_partitions and not zero.overlap_comm
    fp16 = config.fp16
    assert (fp16.enabled, fp16.loss_scale, fp16.initial_scale_power) == (False, 0.0, 16)
    assert (fp16.loss_scale_window, fp16.hysteresis, fp16.min_loss_scale) == (1000, 2, 1.0)
    assert not fp16.consecutive_hysteresis
    assert config.gradient_clipping == 0.0 and config.steps_per_print == 10
    assert not config.wall_clock_breakdown and not config.flops_profiler.enabled
    assert config.precision == "fp32"


def test_metric_and_tuner_type_are_case_insensitive() -> None:
    config = load_config({"autotuning": {"metric": "FLOPS", "tuner_type": "GridSearch"}})
    assert config.autotuning.metric is Metric.flops
    assert config.autotuning.tuner_type is TunerType.gridsearch


def test_integers_written_in_exponent_notation() -> None:
    zero = load_config({"zero_optimization": {"reduce_bucket_size": 5e8}}).zero_optimization
    assert zero.reduce_bucket_size == 500_000_000 and isinstance(zero.reduce_bucket_size, int)


def test_auto_is_kept_where_allowed() -> None:
    config = load_config(
        {
            "train_micro_batch_size_per_gpu": "auto",
            "gradient_clipping": "auto",
            "optimizer": {"type": "AdamW", "params": {"lr": "auto", "betas": "auto"}},
            "fp16": {"enabled": "auto"},
            "zero_optimization": {"stage": 3, "reduce_bucket_size": "auto"},
        }
    )
    assert config.train_micro_batch_size_per_gpu == "auto"
    assert config.zero_optimization.reduce_bucket_size == "auto"
    assert config.gradient_clipping == "auto" and config.fp16.enabled == "auto"
    assert load_config(config.to_dict()) == config


def test_auto_is_rejected_where_not_allowed() -> None:
    with pytest.raises(ConfigError, match=r"^zero_optimization\.stage: "):
        load_config({"zero_optimization": {"stage": "auto"}})


def test_bfloat16_is_an_alias_of_bf16() -> None:
    config = load_config({"bfloat16": {"enabled": True}})
    assert config.bf16.enabled is True and config.precision == "bf16"
    assert "bf16" in config.to_dict() and "bfloat16" not in config.to_dict()


def test_stage3_key_aliases() -> None:
    zero = load_config(
        {"zero_optimization": {"stage": 3, "prefetch_bucket_size": 7, "max_live_parameters": 9}}
    ).zero_optimization
    assert zero.stage3_prefetch_bucket_size == 7 and zero.stage3_max_live_parameters == 9


def test_every_zero_and_offload_key_is_typed() -> None:
    zero = load_config(
        {
            "zero_optimization": {
                "stage": 3,
                "sub_group_size": 1e12,
                "round_robin_gradients": True,
                "stage3_gather_16bit_weights_on_model_save": True,
                "offload_param": {"device": "cpu", "pin_memory": True, "buffer_count": 5},
                "offload_optimizer": {
                    "device": "nvme",
                    "nvme_path": "/local_nvme",
                    "pin_memory": True,
                    "buffer_count": 4,
                    "ratio": 0.3,
                },
            }
        }
    ).zero_optimization
    assert zero.sub_group_size == 10**12 and zero.round_robin_gradients
    assert zero.param_offload_device is OffloadDevice.cpu
    assert zero.offload_optimizer is not None and zero.offload_optimizer.ratio == 0.3
    assert zero.optimizer_offload_device is OffloadDevice.nvme


def test_deprecated_cpu_offload_means_optimizer_offload() -> None:
    zero = load_config({"zero_optimization": {"stage": 2, "cpu_offload": True}}).zero_optimization
    assert zero.optimizer_offload_device is OffloadDevice.cpu


def test_untyped_documented_sections_are_kept_verbatim() -> None:
    sections = {
        "activation_checkpointing": {"partition_activations": False, "number_checkpoints": None},
        "sparse_attention": {"mode": "fixed", "block": 16},
        "data_efficiency": {"enabled": True, "seed": 1234, "data_routing": {"enabled": True}},
        "curriculum_learning": {"enabled": False},
        "tensorboard": {"enabled": True, "output_path": "logs/"},
        "wandb": {"enabled": False, "project": "p"},
        "csv_monitor": {"enabled": True},
        "elasticity": {"enabled": False, "max_train_batch_size": 2000},
        "comms_logger": {"enabled": True, "verbose": False},
        "compression_training": {"weight_quantization": {"shared_parameters": {}}},
        "checkpoint": {"tag_validation": "Warn"},
        "data_types": {"grad_accum_dtype": "fp32"},
        "aio": {"block_size": 1048576, "queue_depth": 8},
    }
    data = load_config(sections).to_dict()
    for name, body in sections.items():
        assert data[name] == body


def test_known_optimizer_and_scheduler_types() -> None:
    for name in ("Adam", "AdamW", "SGD", "Lamb", "RMSprop", "Adagrad"):
        assert load_config({"optimizer": {"type": name}}).optimizer is not None
    for name, params in (
        ("WarmupLR", {}),
        ("WarmupDecayLR", {"total_num_steps": 100}),
        ("OneCycle", {"cycle_min_lr": 0.0, "cycle_max_lr": 0.1}),
        ("LRRangeTest", {"lr_range_test_min_lr": 1e-4}),
    ):
        scheduler = load_config({"scheduler": {"type": name, "params": params}}).scheduler
        assert scheduler is not None and scheduler.typed_params() is not None


def test_torch_optimizer_names_are_case_insensitive() -> None:
    optimizer = load_config({"optimizer": {"type": "rmsprop"}}).optimizer
    assert optimizer is not None and optimizer.type == "RMSprop"


def test_device_memory_budget_takes_sizes() -> None:
    assert load_config({"device_memory_bytes": "2GiB"}).device_memory_bytes == 2 * 2**30
    assert load_config({"device_memory_bytes": 1e9}).device_memory_bytes == 10**9


def test_source_must_be_path_or_dict() -> None:
    with pytest.raises(ConfigError, match="expected a path"):
        load_config(42)  # type: ignore[arg-type]


def test_loading_a_loaded_config_keeps_it() -> None:
    config = load_config({"train_micro_batch_size_per_gpu": 2}, world_size=2)
    assert load_config(config, world_size=2) == config
    assert isinstance(config, Config)
