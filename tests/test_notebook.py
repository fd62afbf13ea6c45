"""One set of numbers everywhere: ``summary.txt``, ``autotune report``,
``load_results(ranked_by=...)`` and ``experiments/analysis.ipynb`` show each configuration
with the ranking's own value, on a latency run whose busy minute disturbed some measurements
(so the median of all its runs is not what the ranking counts). The notebook runs headless,
given its directory relative to where it was started."""

from __future__ import annotations

import json
import re
import statistics
import zlib
from dataclasses import replace
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient
from typer.testing import CliRunner

from autotune.cli import app
from autotune.config import Metric
from autotune.experiment import ExperimentResult, ExperimentSpec, Metrics, Status
from autotune.results import load_results
from autotune.tuning import tune
from tests.runner.sim_cluster import TUNING_CONFIG, config_metrics, tuning_job

NOTEBOOK = Path(__file__).parents[1] / "experiments" / "analysis.ipynb"
BUSY = range(4, 12)  # the experiments a neighbour's job overlapped (1-based, in run order)
SLOWER = 1.6  # how much slower they measured


class BusyMinute:
    """Measures as :func:`config_metrics` does with a few per cent of noise per run, except
    the experiments :data:`BUSY`, taken while another job held the cores: slower, and
    disturbed (``oversubscription`` over the line); stage 0 at micro-batch 8 runs out of
    memory."""

    def __init__(self) -> None:
        self.count = 0

    def run(self, spec: ExperimentSpec) -> ExperimentResult:
        self.count += 1
        config = spec.ds_config
        if (
            config["zero_optimization"]["stage"] == 0
            and config["train_micro_batch_size_per_gpu"] == 8
        ):
            return ExperimentResult(spec.name, Status.oom, error="OutOfMemoryError: 8 samples")
        quiet = config_metrics(spec)
        busy = self.count in BUSY
        noise = 1 + 0.02 * (zlib.crc32(spec.name.encode()) % 5 - 2)  # -4% .. +4%
        steps = [t * noise * (SLOWER if busy else 1) for t in quiet.step_times_s]
        measured = Metrics.from_window(
            steps, quiet.train_batch_size, quiet.flops_per_step, quiet.peak_memory_bytes
        )
        return ExperimentResult(
            spec.name, Status.ok, replace(measured, oversubscription=0.6 if busy else 0.02)
        )


def run_notebook(environment: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> str:
    """The notebook executed in its own folder (as Jupyter runs it) with ``environment``, and
    a last cell that prints what its variables hold; returns that cell's output."""
    for name, value in environment.items():
        monkeypatch.setenv(name, value)
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    probe = """
import json
line = best_so_far(df, metric).get_lines()[0]
print(json.dumps({
    "metric": metric.value,
    "ranked": [[n, v] for n, v in zip(ranked["name"], ranked[metric.value]) if v == v],
    "declared_best": float(line.get_ydata()[-1]),
    "axis": axes[0].get_ylabel(),
}))"""
    notebook.cells.append(nbformat.v4.new_code_cell(probe))
    NotebookClient(
        notebook,
        timeout=120,
        kernel_name="python3",
        resources={"metadata": {"path": str(NOTEBOOK.parent)}},
    ).execute()
    outputs = [o for cell in notebook.cells if cell.cell_type == "code" for o in cell.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    assert any("image/png" in o.get("data", {}) for o in outputs)
    text = "".join(o.get("text", "") for o in outputs)
    assert "oom" in text and "ranked by latency (s/step), lower is better" in text
    return text.strip().splitlines()[-1]


def test_every_output_shows_the_rankings_values_for_a_run_with_disturbed_measurements(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = {**TUNING_CONFIG, "autotuning": {**TUNING_CONFIG["autotuning"], "metric": "latency"}}
    results = tmp_path / "runs" / "latency"
    summary = tune(tuning_job(results, config), BusyMinute()).summary
    ranking = summary.ranking
    expected = [(r.name, r.value) for r in ranking]

    # The case that matters: configurations whose disturbed runs pull the median of all
    # their runs away from the ranking's value (which counts the undisturbed ones).
    runs = load_results(results)
    ok = runs[runs.status == "ok"]
    of_all = ok.groupby(ok["name"].str.replace(r"_r\d+$", "", regex=True))["latency"]
    moved = [r.name for r in ranking if abs(of_all.median()[r.name] / r.value - 1) > 0.1]
    assert moved and any(r.num_disturbed for r in ranking)

    # load_results, ranked by configuration: the ranking's order and values.
    frame = load_results(results, ranked_by="latency")
    frame = frame[frame.status == "ok"]
    assert list(frame["name"]) == [name for name, _ in expected]
    assert list(frame["latency"]) == pytest.approx([value for _, value in expected])
    # The other metrics fold the same runs: throughput is the median over them too.
    for ranked, throughput in zip(ranking, frame["throughput"], strict=True):
        batch = ok.set_index("name").loc[ranked.runs[0], "train_batch_size"]
        assert throughput == pytest.approx(statistics.median(batch / v for v in ranked.values))

    # autotune report (no DIR flag needed for the metric: the run's recorded one), as JSON and
    # as the table a person reads.
    cli = CliRunner()
    reported = json.loads(cli.invoke(app, ["report", str(results), "-f", "json"]).stdout)
    shown = [(row["name"], row["latency"]) for row in reported if row["status"] == "ok"]
    assert [name for name, _ in shown] == [name for name, _ in expected]
    assert [value for _, value in shown] == pytest.approx([value for _, value in expected])
    table = cli.invoke(app, ["report", str(results)]).stdout
    rows = [line for line in table.splitlines() if line.startswith("│ z")]
    assert [re.split(r"\s*│\s*", row)[1] for row in rows[: len(expected)]] == [
        name for name, _ in expected
    ]
    for row, (_, value) in zip(rows, expected, strict=False):
        assert f" {value:.4g} " in row

    # summary.txt: the best and each variant's best, with the same values.
    text = (results / "summary.txt").read_text()
    best = ranking[0]
    assert f"best: {best.name}  latency {Metric.latency.display(best.value)}" in text
    for variant, ranked in summary.best_per_variant.items():
        line = f"  {variant:12s} {ranked.name:40s} latency {Metric.latency.display(ranked.value)}"
        assert line in text

    # The notebook, given the directory relative to where Jupyter was started (its kernel
    # runs in experiments/): latency, lower better, the same rows and values.
    environment = {"AUTOTUNE_RESULTS_DIR": "runs/latency", "PWD": str(tmp_path)}
    probed = json.loads(run_notebook(environment, monkeypatch))
    assert probed["metric"] == "latency" and probed["axis"] == Metric.latency.label
    assert [name for name, _ in probed["ranked"]] == [name for name, _ in expected]
    assert [value for _, value in probed["ranked"]] == pytest.approx(
        [value for _, value in expected]
    )
    assert probed["declared_best"] == pytest.approx(best.value)
