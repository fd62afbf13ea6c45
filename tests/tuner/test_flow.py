"""The flow: phases, fast mode, outputs."""

from __future__ import annotations

import math

import pytest

from autotune.config import load_config
from autotune.summary_text import not_run_texts, stop_text, summary_json
from autotune.tuner import Phase, Tuner
from autotune.tuner.reasons import Unrun
from tests.tuner.landscape import MODEL, Landscape, drive, true_largest_fit
from tests.tuner.tuners import fast_tuner, small_tuner


def test_fast_stops_after_stages_and_micro_batches() -> None:
    tuner = fast_tuner(Landscape().budget_bytes, tuner_early_stopping=99)
    asked = drive(tuner, Landscape())
    assert {c.phase for c in asked} == {Phase.max_micro_batch, Phase.micro_batch}
    assert {c.stage for c in asked} == {0, 1, 2, 3}
    for stage in range(4):
        largest = true_largest_fit(Landscape(), stage)
        compared = [
            c.micro_batch_size for c in asked if c.stage == stage and c.phase is Phase.micro_batch
        ]
        # The largest fit (run by the search) and two sizes about half apart below it.
        assert compared == [largest // 2, largest // 4]
    assert stop_text(tuner.summary().stop) == "search space exhausted"


@pytest.mark.parametrize(
    ("told_budget", "real_budget"),
    [
        (1_500_000_000, 1_500_000_000),  # the estimate is close: climb past its margin, bisect
        (1_500_000_000, 900_000_000),  # it overestimates: halve, then bisect
        (None, 1_500_000_000),  # no estimate: from the largest allowed size down
    ],
)
def test_the_largest_micro_batch_is_found_exactly_by_bracketing_then_bisecting(
    told_budget: int | None, real_budget: int
) -> None:
    landscape = Landscape(budget_bytes=real_budget)
    tuner = fast_tuner(told_budget, max_train_micro_batch_size_per_gpu=256)
    asked = drive(tuner, landscape)
    for stage in range(4):
        probes = [c for c in asked if c.stage == stage and c.phase is Phase.max_micro_batch]
        largest = true_largest_fit(landscape, stage, cap=256)
        fits = [c.micro_batch_size for c in probes if landscape.run(c).ok]
        failures = [c.micro_batch_size for c in probes if not landscape.run(c).ok]
        assert max(fits) == largest and min(failures) == largest + 1  # exact: bracketed to 1
        # Bisection: a logarithmic number of runs (about 4 with a close estimate, 8 for 1..256).
        print(
            f"budget {told_budget}/{real_budget} z{stage}: {[c.micro_batch_size for c in probes]}"
        )
        assert len(probes) <= (4 if told_budget == real_budget else 2 + math.ceil(math.log2(256)))


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
    summary = summary_json(tuner.summary())
    assert summary["best"]["name"] and summary["num_run"] >= summary["num_failed"]
    assert summary["best_overrides"]["train_micro_batch_size_per_gpu"] == mbs


def test_nothing_ok_means_no_optimal_config() -> None:
    tuner = Tuner(load_config({"zero_optimization": {"stage": 0}}, 2))
    drive(tuner, Landscape(budget_bytes=1))
    assert tuner.optimal_config() is None and tuner.summary().best is None
    assert "z0" in not_run_texts(tuner.summary())


def test_model_based_measures_every_variant_and_stops_when_nothing_can_beat_the_best() -> None:
    landscape = Landscape(noise=0.02)
    tuner = fast_tuner(landscape.budget_bytes, tuner_type="model_based", num_remeasure=2)
    asked = drive(tuner, landscape)
    grid = drive(fast_tuner(landscape.budget_bytes, tuner_early_stopping=99), landscape)
    optimum = max(landscape.throughput(c.ds_config) for c in grid if landscape.run(c).ok)
    summary = tuner.summary()
    best = tuner.optimal_config()
    assert best is not None and landscape.throughput(best) >= 0.98 * optimum
    assert set(summary.best_per_variant) == {"z0", "z1", "z2", "z3"}  # each measured once
    assert stop_text(summary.stop).startswith("the cost model predicts no configuration left")
    assert len(asked) < len(grid)  # the grid's 20 are its search alone
    assert summary.cost_model is not None and summary.cost_model["num_observations"] > 0


def test_a_variant_the_trial_cap_never_reached_is_not_called_one_where_nothing_fits() -> None:
    tuner = small_tuner("gridsearch", tuner_num_trials=2)
    asked = drive(tuner, Landscape())
    assert {c.stage for c in asked} == {1}  # the cap ended the search inside stage 1
    assert not_run_texts(tuner.summary())["z2"] == "not searched: the search ended first"


def test_what_did_not_run_is_counted_in_configurations() -> None:
    tuner = small_tuner("gridsearch", tuner_num_trials=2)
    drive(tuner, Landscape())
    summary = tuner.summary()
    plans = tuner.space.plan(tuner.history()).plans
    ladders = {plan.variant.label: plan.ladder for plan in plans}
    # A whole variant never searched is every micro-batch size it has, not one line.
    assert summary.not_run_counts[Unrun.variant("z2")] == len(ladders["z2"]) > 1
    singles = [unrun for unrun in summary.not_run if unrun != Unrun.variant("z2")]
    assert singles and all(summary.not_run_counts[unrun] == 1 for unrun in singles)
    assert summary.num_not_run == len(ladders["z2"]) + len(singles)
