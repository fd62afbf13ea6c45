"""Which directory the analysis notebook reads: ``AUTOTUNE_RESULTS_DIR`` as docs/results.md says,
absolute or relative to where Jupyter was started, though its kernel runs in experiments/."""

from __future__ import annotations

from pathlib import Path

import pytest

from autotune.results import ResultsDirError
from autotune.results.notebook import EXAMPLE_RUN, RESULTS_DIR_VARIABLE, notebook_results_dir
from autotune.results.store import FINGERPRINT_NAME


def results_dir(path: Path) -> Path:
    path.mkdir(parents=True)
    (path / FINGERPRINT_NAME).write_text("{}")
    return path


def test_unset_it_is_the_example_run_beside_the_notebook(tmp_path: Path) -> None:
    kernel = tmp_path / "experiments"
    assert notebook_results_dir({}, kernel) == kernel / EXAMPLE_RUN
    assert notebook_results_dir({RESULTS_DIR_VARIABLE: " "}, kernel) == kernel / EXAMPLE_RUN


def test_an_absolute_path_is_taken_as_it_is(tmp_path: Path) -> None:
    given = {RESULTS_DIR_VARIABLE: str(tmp_path / "runs" / "a"), "PWD": "/elsewhere"}
    assert notebook_results_dir(given, tmp_path) == tmp_path / "runs" / "a"


def test_a_relative_path_is_taken_from_where_jupyter_was_started(tmp_path: Path) -> None:
    started, kernel = tmp_path / "repo", tmp_path / "repo" / "experiments"
    found = results_dir(started / "runs" / "mine")
    results_dir(kernel / "runs" / "mine")  # the same name beside the notebook loses
    given = {RESULTS_DIR_VARIABLE: "runs/mine", "PWD": str(started)}
    assert notebook_results_dir(given, kernel) == found


def test_a_relative_path_found_only_beside_the_notebook_is_taken_from_there(
    tmp_path: Path,
) -> None:
    kernel = tmp_path / "experiments"
    found = results_dir(kernel / "mine")
    for given in (
        {RESULTS_DIR_VARIABLE: "mine", "PWD": str(tmp_path)},
        {RESULTS_DIR_VARIABLE: "mine"},
    ):
        assert notebook_results_dir(given, kernel) == found


def test_a_path_found_nowhere_names_every_place_it_was_looked_for(tmp_path: Path) -> None:
    given = {RESULTS_DIR_VARIABLE: "runs/typo", "PWD": str(tmp_path / "repo")}
    with pytest.raises(ResultsDirError) as raised:
        notebook_results_dir(given, tmp_path / "repo" / "experiments")
    message = str(raised.value)
    assert f"{RESULTS_DIR_VARIABLE}=runs/typo" in message
    assert str(tmp_path / "repo" / "runs" / "typo") in message
    assert str(tmp_path / "repo" / "experiments" / "runs" / "typo") in message
