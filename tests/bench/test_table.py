"""The tabular benchmark: TableRunner answers from a measured landscape; tuners replay on it."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest

from autotune.bench.table import WITHIN, MissingMeasurement, TableRunner, replay
from autotune.experiment import Status
from tests.experiment_scripts import load_script
from tests.specs import job_spec

LANDSCAPES = sorted((Path(__file__).resolve().parents[2] / "results" / "landscapes").glob("*.json"))
TABLE = {
    "configs": {
        "z1_mbs2": {"status": "ok", "throughput": [9.0, 10.0, 12.0], "duration_s": [2.0, 2.0]},
        "z1_mbs4": {"status": "ok", "throughput": [18.0, 20.0, 21.0], "duration_s": [3.0]},
        "z1_mbs8": {"status": "oom", "throughput": [], "duration_s": [1.0]},
        "z1_mbs4_oc1": {"status": "ok", "throughput": [30.0, 30.0, 30.0], "duration_s": [3.0]},
    }
}


def run(runner: TableRunner, name: str, batch: int = 4) -> tuple[Status, float | None]:
    result = runner.run(job_spec(name, {"train_batch_size": batch}))
    return result.status, result.metrics.throughput if result.metrics else None


def test_the_table_says_oom_and_the_median_plus_its_own_noise() -> None:
    runner = TableRunner(TABLE, seed=3)
    assert run(runner, "z1_mbs8")[0] is Status.oom
    assert runner.value("z1_mbs4") == 20.0 and runner.best_value == 30.0
    status, value = run(runner, "z1_mbs4")
    # The noise is the table's own: each measurement's ratio to its configuration's median.
    ratios = {9 / 10, 10 / 10, 12 / 10, 18 / 20, 20 / 20, 21 / 20}  # z1_mbs2, z1_mbs4
    assert status is Status.ok and value is not None
    assert any(value == pytest.approx(20.0 * r) for r in ratios)
    # Seeded by the seed and the name: the same again, another draw for a re-measurement.
    assert run(TableRunner(TABLE, seed=3), "z1_mbs4") == (status, value)
    draws = {run(TableRunner(TABLE, seed=s), "z1_mbs4")[1] for s in range(30)}
    assert len(draws) > 2


def test_sizes_the_measurement_did_not_visit_follow_memory_and_interpolate() -> None:
    runner = TableRunner(TABLE)
    assert run(runner, "z1_mbs9")[0] is Status.oom  # above a size that ran out of memory
    assert runner.value("z1_mbs3") == pytest.approx(15.0)  # between 2 (10.0) and 4 (20.0)
    assert runner.value("z1_mbs1") == pytest.approx(5.0)  # from no throughput at size 0
    with pytest.raises(MissingMeasurement, match="no measurement of z1_mbs6"):
        runner.value("z1_mbs6_oc1")  # above what ran with these knobs or without, no failure


def test_the_peak_memory_of_a_size_not_measured_lies_on_the_line_between_its_neighbours() -> None:
    table = json.loads(json.dumps(TABLE))
    table["configs"]["z1_mbs2"]["peak_memory_bytes"] = 2_000
    table["configs"]["z1_mbs4"]["peak_memory_bytes"] = 3_000
    result = TableRunner(table).run(job_spec("z1_mbs3", {"train_batch_size": 6}))
    assert result.metrics is not None and result.metrics.peak_memory_bytes == 2_500


@pytest.mark.parametrize("path", LANDSCAPES, ids=[p.stem for p in LANDSCAPES])
def test_on_real_measurements_the_search_finds_each_stages_largest_micro_batch(
    path: Path,
) -> None:
    table = json.loads(path.read_text())
    runner = TableRunner(table)
    # The landscape's own answer, per variant at its default knobs: the largest size that ran
    # and a failure one size above it (the measurement ran the same search).
    largest: dict[str, int] = {}
    for name in table["configs"]:
        variant, _, rest = name.partition("_mbs")
        if rest.isdigit() and runner.value(name) is not None:
            largest[variant] = max(largest.get(variant, 0), int(rest))
    cap = table["how"]["config"]["autotuning"]["max_train_micro_batch_size_per_gpu"]
    bracketed = {v: s for v, s in largest.items() if s < cap}  # else the largest allowed fits
    for variant, size in bracketed.items():
        assert runner.value(f"{variant}_mbs{size + 1}") is None  # bracketed to one size
    # model_based searches a stage's memory boundary only where the stage could win.
    for tuner_type in ("gridsearch", "random"):
        asked = replay(table, tuner_type, seed=1).names
        for variant, size in largest.items():
            assert f"{variant}_mbs{size}" in asked
            assert variant not in bracketed or f"{variant}_mbs{size + 1}" in asked


@pytest.mark.parametrize("path", LANDSCAPES, ids=[p.stem for p in LANDSCAPES])
def test_each_landscape_separates_its_best_from_its_median_configuration(path: Path) -> None:
    runner = TableRunner(json.loads(path.read_text()))
    medians = sorted(v for n in runner.names if (v := runner.value(n)) is not None)
    assert runner.best_value >= 1.2 * medians[len(medians) // 2]


@pytest.mark.parametrize("path", LANDSCAPES, ids=[p.stem for p in LANDSCAPES])
def test_each_landscapes_top_is_refined_to_within_2pct(path: Path) -> None:
    # experiments/landscape.py --refine raced the configurations near the 2% line, so the
    # best median is known to better than 2% (one measurement alone varies 7-10% here).
    table = json.loads(path.read_text())
    assert table["how"]["refined"]["rounds"] > 0
    assert load_script("bench_tuner").landscape_shape(table)["best_uncertainty"] <= 0.02


# Six seeds: the median of each tuner's final share; the seeded sequences themselves are pinned
# by test_proposals. One replay per tuner and seed serves every check below (a model_based
# replay decides with the cost model each step: seconds on 2 cores).
REPLAY_SEEDS = range(6)


@pytest.mark.slow
@pytest.mark.parametrize("path", LANDSCAPES, ids=[p.stem for p in LANDSCAPES])
def test_every_tuner_replays_each_landscape_and_ends_in_the_top_region(path: Path) -> None:
    table = json.loads(path.read_text())
    assert table["how"]["repeats"] >= 3 and table["model_info"]["num_params"] > 0
    for tuner_type in ("gridsearch", "random", "model_based"):
        finals = [replay(table, tuner_type, s) for s in REPLAY_SEEDS]  # asks only what it has
        assert all(r.final is not None and r.values for r in finals)
        # Each landscape's median configuration is worth at most 0.83 of its best; a tuner
        # that searched the wrong stage, kept a too-small micro-batch or declared a lucky
        # measurement best ends near it. Which of the top few is best is within one
        # measurement's noise (see docs/benchmarks.md), so this asks for the top region, not
        # the top one.
        shares = [(r.final or 0.0) / r.best for r in finals]
        print(f"{path.stem} {tuner_type}: final/best median {statistics.median(shares):.3f}")
        assert statistics.median(shares) >= 0.95
        if tuner_type == "model_based":
            # The bound (DeepSpeed's fast mode needed 9-34 on its published models).
            # Every tuner gets there in 2-5 on these tables: each stage's largest
            # micro-batch, which every search runs first, is within a few per cent of the
            # best.
            reach = [r.experiments_to(WITHIN) or 10_000 for r in finals]
            assert statistics.median(reach) <= 12


def test_model_based_replays_a_gpu_shaped_landscape_deterministically_and_cheaply() -> None:
    from autotune.bench.simulated import MODELS, simulated_landscape

    table = simulated_landscape(MODELS["gpt-1.3b"], "a100-80gb", seed=0)
    first, again = replay(table, "model_based", seed=3), replay(table, "model_based", seed=3)
    assert first.names == again.names  # decided from the results alone
    grid = replay(table, "gridsearch", seed=3)
    assert first.ends_within(0.98) and grid.ends_within(0.98)
    assert len(first.names) < len(grid.names) / 2


def test_a_replay_warm_started_from_another_measures_its_answer_first() -> None:
    from autotune.bench.simulated import MODELS, simulated_landscape
    from autotune.tuner.warm_start import WarmStart

    table = simulated_landscape(MODELS["gpt-1.3b"], "a100-80gb", seed=0)
    before = replay(table, "model_based", seed=3)
    assert before.cost_model is not None and before.answer is not None
    warm = WarmStart(cost_model=before.cost_model, answers=(before.answer,))
    after = replay(table, "model_based", seed=4, warm_start=warm)
    assert after.values[0] == before.final  # the answer's median: it ran first
    assert after.ends_within(0.98)
