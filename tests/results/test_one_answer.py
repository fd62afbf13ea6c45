"""One winner everywhere: summary.txt, ds_config_optimal.json, ``autotune report`` and
``load_results(ranked_by=...)`` take it from one ranking (repeats folded), even when a single
lucky measurement stands above the configuration the run declared best."""

from __future__ import annotations

import json
import re
from dataclasses import replace
from pathlib import Path

import pytest
from typer.testing import CliRunner

from autotune.cli import app
from autotune.experiment import ExperimentResult, ExperimentSpec, Status
from autotune.results import load_results
from autotune.tuning import tune
from tests.runner.sim_cluster import config_metrics, tuning_job

LUCK = 1.5  # the first measurement of each ZeRO-3 configuration reads this much too fast


class LuckyFirstRuns:
    """Measures every configuration as :func:`config_metrics` does, except the first run of
    a ZeRO-3 configuration, which is lucky: its steps take 1/LUCK of the time."""

    def run(self, spec: ExperimentSpec) -> ExperimentResult:
        metrics = config_metrics(spec)
        lucky = spec.ds_config["zero_optimization"]["stage"] == 3
        if lucky and spec.repeat_of is None:
            steps = tuple(t / LUCK for t in metrics.step_times_s)
            metrics = replace(
                metrics,
                step_times_s=steps,
                latency=metrics.latency / LUCK,
                throughput=metrics.throughput * LUCK,
                flops=metrics.flops * LUCK,
            )
        return ExperimentResult(spec.name, Status.ok, metrics)


def test_report_best_summary_and_frame_name_the_same_winner(tmp_path: Path) -> None:
    report = tune(tuning_job(tmp_path), LuckyFirstRuns())
    best = report.summary.best
    assert best is not None and best.num_measurements > 1
    # A single lucky ZeRO-3 run is the fastest measurement, but not the declared best.
    runs = load_results(tmp_path, ranked_by="throughput", runs=True)
    assert runs.iloc[0]["zero_stage"] == 3 and runs.iloc[0]["name"] != best.name

    table = CliRunner().invoke(app, ["report", str(tmp_path), "-f", "json"])
    reported = json.loads(table.stdout)
    frame = load_results(tmp_path, ranked_by="throughput")
    summary_text = (tmp_path / "summary.txt").read_text()
    declared = re.search(r"^best: (\S+)", summary_text, re.MULTILINE)
    assert declared is not None
    optimal = json.loads((tmp_path / "ds_config_optimal.json").read_text())
    assert reported[0]["name"] == frame.iloc[0]["name"] == declared.group(1) == best.name
    assert [r["name"] for r in reported] == [r.name for r in report.summary.ranking]
    assert optimal["zero_optimization"]["stage"] == frame.iloc[0]["zero_stage"]
    assert optimal["train_micro_batch_size_per_gpu"] == frame.iloc[0]["micro_batch_size"]
    assert reported[0]["runs"] == best.num_measurements
    assert reported[0]["throughput"] == pytest.approx(best.value)


def test_best_names_the_path_summary_txt_names(tmp_path: Path) -> None:
    tune(tuning_job(tmp_path), LuckyFirstRuns())
    path = CliRunner().invoke(app, ["best", str(tmp_path)]).stdout.strip()
    assert f"optimal config: {path}" in (tmp_path / "summary.txt").read_text()


class ByConfig:
    """Every run of a configuration measures the same (:func:`config_metrics`)."""

    def run(self, spec: ExperimentSpec) -> ExperimentResult:
        return ExperimentResult(spec.name, Status.ok, config_metrics(spec))


def test_each_metrics_answer_is_kept_and_best_gives_it(tmp_path: Path) -> None:
    from tests.runner.sim_cluster import TUNING_CONFIG

    def tuned_by(metric: str) -> tuple[str, str]:
        config = {**TUNING_CONFIG, "autotuning": {**TUNING_CONFIG["autotuning"], "metric": metric}}
        tune(tuning_job(tmp_path, config), ByConfig())
        return metric, (tmp_path / "ds_config_optimal.json").read_text()

    answers = dict([tuned_by("throughput"), tuned_by("latency")])  # one folder, both metrics
    assert answers["throughput"] != answers["latency"]  # the largest micro-batch; the smallest

    def best(*args: str) -> str:
        result = CliRunner().invoke(app, ["best", str(tmp_path), *args])
        assert result.exit_code == 0, result.output
        return Path(result.stdout.strip()).read_text()

    assert best() == answers["latency"]  # ds_config_optimal.json: the last run's
    assert best("--metric", "throughput") == answers["throughput"]  # kept, not overwritten
    assert best("--metric", "latency") == answers["latency"]
    never = CliRunner().invoke(app, ["best", str(tmp_path), "--metric", "flops"])
    assert never.exit_code == 2
    assert never.stderr.startswith(f"error: {tmp_path}: no run there ranked by flops")
