"""What ``autotune report`` and the plots show of a metric comes from :class:`Metric`."""

from __future__ import annotations

import json

import matplotlib

matplotlib.use("Agg")

import pytest
from typer.testing import CliRunner

from autotune.cli import app
from autotune.experiment import Status
from autotune.metric import PEAK_MEMORY_LABEL, Metric
from autotune.results import ResultsDir, best_so_far, load_results, metric_vs_micro_batch
from autotune.results.plots import MEMORY_AXIS_LABEL, throughput_vs_memory
from tests.results.records import commit, make_result, make_spec


@pytest.fixture
def filled(results: ResultsDir) -> ResultsDir:
    commit(results, make_spec("z1_m2", 1, 2), make_result("z1_m2", Status.oom))
    for name, stage, micro, throughput in (("z1_m4", 1, 4, 10), ("z2_m4", 2, 4, 14)):
        commit(results, make_spec(name, stage, micro), make_result(name, throughput=throughput))
    return results


@pytest.mark.parametrize("metric", list(Metric))
def test_the_report_table_is_headed_by_the_metrics_label_and_ranked_its_way(
    filled: ResultsDir, metric: Metric
) -> None:
    table = CliRunner().invoke(app, ["report", str(filled.path), "--metric", metric.value])
    assert table.exit_code == 0, table.output
    assert f"configurations by {metric.value}" in table.stdout
    assert metric.label in table.stdout and PEAK_MEMORY_LABEL in table.stdout
    rows = CliRunner().invoke(
        app, ["report", str(filled.path), "-f", "json", "--metric", metric.value]
    )
    names = [row["name"] for row in json.loads(rows.stdout)]
    # z2_m4 is faster: first by every metric; the oom last.
    assert names == ["z2_m4", "z1_m4", "z1_m2"]


@pytest.mark.parametrize("metric", list(Metric))
def test_the_plots_label_their_axes_with_the_metrics_label(
    filled: ResultsDir, metric: Metric
) -> None:
    frame = load_results(filled.path)
    assert metric_vs_micro_batch(frame, metric).get_ylabel() == metric.label
    assert best_so_far(frame, metric.value).get_ylabel() == metric.label
    memory = throughput_vs_memory(frame)
    assert (memory.get_xlabel(), memory.get_ylabel()) == (
        MEMORY_AXIS_LABEL,
        Metric.throughput.label,
    )


def test_the_report_piped_is_the_same_table_whatever_the_terminals_width(
    filled: ResultsDir, monkeypatch: pytest.MonkeyPatch
) -> None:
    # COLUMNS is the terminal's width, exported by some shells: a table written to a pipe or
    # a file (CliRunner's output is not a terminal) keeps every row on one line regardless.
    monkeypatch.delenv("COLUMNS", raising=False)
    wide = CliRunner().invoke(app, ["report", str(filled.path)]).stdout
    for columns in ("40", "80", "120"):
        monkeypatch.setenv("COLUMNS", columns)
        assert CliRunner().invoke(app, ["report", str(filled.path)]).stdout == wide
    assert Metric.throughput.label in wide and PEAK_MEMORY_LABEL in wide
