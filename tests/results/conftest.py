"""The results directory fixture; the records it is filled with are in ``records.py``."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from autotune.results import ResultsDir
from tests.results.records import FINGERPRINT


@pytest.fixture
def results(tmp_path: Path) -> Iterator[ResultsDir]:
    opened = ResultsDir.open(tmp_path / "run", FINGERPRINT)
    yield opened
    opened.close()
