"""experiments/analysis.ipynb runs headless against a fresh results directory."""

from __future__ import annotations

import os
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

from autotune.experiment import Status
from autotune.results import ResultsDir
from tests.results.records import FINGERPRINT, make_result, make_spec

NOTEBOOK = Path(__file__).parents[1] / "experiments" / "analysis.ipynb"


def test_the_analysis_notebook_executes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with ResultsDir.open(tmp_path / "run", FINGERPRINT) as results:
        for index, (stage, micro) in enumerate([(1, 2), (1, 4), (2, 4), (3, 8)]):
            name = f"z{stage}_mbs{micro}"
            results.record(make_spec(name, stage, micro), make_result(name, throughput=10 + index))
        results.record(make_spec("z0_mbs8", 0, 8), make_result("z0_mbs8", Status.oom))
    monkeypatch.setenv("AUTOTUNE_RESULTS_DIR", str(results.path))
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    NotebookClient(
        notebook,
        timeout=120,
        kernel_name="python3",
        resources={"metadata": {"path": str(NOTEBOOK.parent)}},
    ).execute()
    outputs = [o for cell in notebook.cells if cell.cell_type == "code" for o in cell.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    text = "".join(o.get("text", "") for o in outputs)
    assert "5 experiments" in text
    assert any("image/png" in o.get("data", {}) for o in outputs)
    assert os.environ["AUTOTUNE_RESULTS_DIR"] == str(results.path)
