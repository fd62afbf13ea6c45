"""experiments/bench_tuner.py's yardstick: the pure parts, without running an experiment."""

from __future__ import annotations

import doctest
import math
from dataclasses import replace
from pathlib import Path
from types import ModuleType

import pytest

from autotune.experiment import ExperimentResult, ExperimentSpec, Metrics, Status
from autotune.tuner import Tuner
from tests.experiment_scripts import load_script


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    return load_script("bench_tuner")


def measured(name: str, samples_per_s: float) -> ExperimentResult:
    metrics = Metrics.from_window([8 / samples_per_s], 8, 1e9, peak_memory_bytes=0)
    return ExperimentResult(name, Status.ok, metrics)


def test_the_goal_is_a_share_of_the_best_median_of_repeats_not_the_luckiest_grid_run(
    bench: ModuleType,
) -> None:
    grid = {"lucky": 30.0, "steady": 26.0, "third": 25.0, "slow": 20.0}
    repeats = [
        measured("lucky_r1", 24.0),
        measured("steady_r1", 26.0),
        measured("third_r1", 25.0),
        measured("lucky_r2", 25.0),
        measured("steady_r2", 25.5),
        ExperimentResult("third_r2", Status.timeout),  # a failed repeat does not count
        measured("lucky_r3", 23.0),
        measured("steady_r3", 27.0),
        measured("third_r3", 24.0),
    ]
    configs = ["lucky", "steady", "third"] * 3
    stick = bench.yardstick(grid, list(zip(configs, repeats, strict=True)))

    assert [r.name for r in stick.remeasured] == ["steady", "third", "lucky"]
    assert stick.best.values == (26.0, 25.5, 27.0)  # the grid's measurement is left out
    assert stick.goal == pytest.approx(0.97 * 26.0)
    assert stick.worth == {"lucky": 24.0, "steady": 26.0, "third": 24.5, "slow": 20.0}
    figures = stick.to_dict()
    assert figures["best"] == "steady" and figures["configs"][0]["grid"] == 26.0
    assert figures["configs"][2]["spread"] == pytest.approx(2.0 / 24.0)


def test_without_a_repeat_that_ran_ok_there_is_no_yardstick(bench: ModuleType) -> None:
    with pytest.raises(ValueError, match="no re-measurement"):
        bench.yardstick({"a": 10.0}, [("a", ExperimentResult("a_r1", Status.oom))])


def test_reach_counts_experiments_and_seconds_until_the_goal(bench: ModuleType) -> None:
    timeline = [
        {"name": "a", "elapsed_s": 3.0},
        {"name": "b", "elapsed_s": 7.0},
        {"name": "c", "elapsed_s": 12.0},
    ]
    worth = {"a": 10.0, "b": 25.0, "c": 30.0}
    assert bench.reach(timeline, worth, goal=24.0) == {
        "experiments_run": 3,
        "seconds_run": 12.0,
        "reached": True,
        "experiments_to_goal": 2,
        "seconds_to_goal": 7.0,
    }
    missed = bench.reach(timeline, worth, goal=31.0)
    assert not missed["reached"] and missed["experiments_to_goal"] is None


def test_remeasures_round_by_round_and_reports(
    bench: ModuleType, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    job = bench.make_job("gridsearch", 10, tmp_path, max_micro_batch=8)
    first = Tuner(job.config).ask()
    assert first is not None
    candidates = [replace(first, name="a"), replace(first, name="b")]
    ran: list[ExperimentSpec] = []

    class Runner:
        def run(self, spec: ExperimentSpec) -> ExperimentResult:
            ran.append(spec)
            return measured(spec.name, 20.0 + len(ran))

    repeats = bench.remeasure(job, candidates, 2, Runner())
    assert [s.name for s in ran] == ["a_r1", "b_r1", "a_r2", "b_r2"]
    assert [s.repeat_of for s in ran] == ["a", "b", "a", "b"]
    assert all(s.ds_config == first.ds_config for s in ran)
    stick = bench.yardstick({"a": 30.0, "b": 22.0}, repeats)
    assert (stick.best.name, stick.best.value) == ("b", 23.0)

    row = {"budget": 4, **bench.reach([{"name": "b", "elapsed_s": 2.0}], stick.worth, stick.goal)}
    bench.print_report(stick, {"gridsearch": row}, repeats=2)
    out = capsys.readouterr().out
    assert "median of b's repeats" in out and "gridsearch" in out


def test_the_examples_in_the_script_hold(bench: ModuleType) -> None:
    failed, attempted = doctest.testmod(bench)
    assert failed == 0 and attempted >= 2


def test_a_landscapes_shape_says_what_ending_within_2pct_costs(bench: ModuleType) -> None:
    spread = (0.9, 1.0, 1.1)  # one measurement ±10%
    medians = {"best": 100.0, "tie": 99.0, "below": 97.0, "far": 50.0}
    configs = {
        name: {"status": "ok", "throughput": [m * f for f in spread]} for name, m in medians.items()
    }
    configs["oom"] = {"status": "oom", "throughput": []}
    shape = bench.landscape_shape({"configs": configs})
    assert (shape["ok"], shape["within_2pct"]) == (4, 2)
    assert shape["best_over_median"] == pytest.approx(100 / 98)
    assert shape["best_margin"] == pytest.approx(math.log(100 / 97))
    # Two medians 3% apart at ±10% a measurement: about 2 (1.28 x 1.25 x 0.1 / 0.03)^2 each.
    assert 50 <= shape["repeats_to_separate"] <= 70


def test_the_replay_reads_only_landscape_tables_and_adds_the_warm_row(
    bench: ModuleType, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import argparse
    import json
    import shutil

    table = Path(__file__).resolve().parents[2] / "results" / "landscapes" / "mlp_wide_256mib.json"
    folder = tmp_path / "landscapes"
    folder.mkdir()
    shutil.copy(table, folder)
    (folder / "earlier_out.json").write_text('{"within": 0.98, "landscapes": {}}')
    out = tmp_path / "replay.json"
    args = argparse.Namespace(landscapes=folder, simulated=False, seeds=1, warm_from=table, out=out)
    bench.main_replay(args)
    assert "skipped" in capsys.readouterr().out
    rows = json.loads(out.read_text())["landscapes"]["mlp_wide_256mib"]["tuners"]
    assert list(rows) == [*bench.TUNERS, "model_based, warm from mlp_wide_256mib"]
    assert rows["model_based, warm from mlp_wide_256mib"]["seeds"] == 1
