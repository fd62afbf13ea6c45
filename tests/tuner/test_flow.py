"""The flow: phases, fast mode, outputs."""

from __future__ import annotations

from autotune.config import load_config
from autotune.tuner import Phase, Tuner
from tests.tuner.landscape import MODEL, Landscape, drive


def test_fast_stops_after_stages_and_micro_batches() -> None:
    config = load_config(
        {
            "autotuning": {
                "tuner_type": "gridsearch",
                "num_remeasure": 0,
                "tuner_early_stopping": 99,
            }
        },
        2,
    )
    tuner = Tuner(config, MODEL, device_memory_bytes=Landscape().budget_bytes)
    asked = drive(tuner, Landscape())
    assert {c.phase for c in asked} == {Phase.max_micro_batch, Phase.micro_batch}
    assert {c.stage for c in asked} == {0, 1, 2, 3}
    per_stage = {s: [c.micro_batch_size for c in asked if c.stage == s] for s in range(4)}
    assert all(len(sizes) == 3 for sizes in per_stage.values())  # num_tuning_micro_batch_sizes
    assert tuner.summary().stop_reason == "search space exhausted"


def test_slow_mode_tunes_each_surviving_stage_at_its_best_micro_batch() -> None:
    raw = {
        "autotuning": {
            "tuner_type": "gridsearch",
            "fast": False,
            "num_remeasure": 0,
            "tuner_early_stopping": 999,
            "tuner_num_trials": 999,
        }
    }
    tuner = Tuner(load_config(raw, 2), MODEL, device_memory_bytes=Landscape().budget_bytes)
    asked = drive(tuner, Landscape())
    knobs = [c for c in asked if c.phase is Phase.knobs]
    assert {c.stage for c in knobs} == {1, 2, 3}  # stage 0 has no knobs by default
    for stage in (1, 2, 3):
        assert len({c.micro_batch_size for c in knobs if c.stage == stage}) == 1
    assert set(tuner.summary().best_per_variant) == {"z0", "z1", "z2", "z3"}


def test_the_optimal_config_keeps_the_users_settings() -> None:
    raw = {
        "train_batch_size": 96,
        "optimizer": {"type": "AdamW", "params": {"lr": 3e-4}},
        "gradient_clipping": 1.0,
        "zero_optimization": {"stage": [1, 2]},
        "autotuning": {"enabled": True, "tuner_type": "random", "num_remeasure": 1},
    }
    tuner = Tuner(load_config(raw, 2), MODEL, device_memory_bytes=Landscape().budget_bytes)
    drive(tuner, Landscape())
    best = tuner.optimal_config()
    assert best is not None and "autotuning" not in best
    assert best["optimizer"] == raw["optimizer"] and best["gradient_clipping"] == 1.0
    assert best["train_batch_size"] == 96
    mbs, gas = best["train_micro_batch_size_per_gpu"], best["gradient_accumulation_steps"]
    assert mbs * gas * 2 == 96 and best["zero_optimization"]["stage"] in (1, 2)
    summary = tuner.summary().to_dict()
    assert summary["best"]["name"] and summary["num_run"] >= summary["num_failed"]
    assert summary["best_overrides"]["train_micro_batch_size_per_gpu"] == mbs


def test_nothing_ok_means_no_optimal_config() -> None:
    tuner = Tuner(load_config({"zero_optimization": {"stage": 0}}, 2))
    drive(tuner, Landscape(budget_bytes=1))
    assert tuner.optimal_config() is None and tuner.summary().best is None
    assert "z0" in tuner.summary().pruned
