"""Progress while several experiments run: each running one is shown."""

from __future__ import annotations

import io
import re
from pathlib import Path

from rich.console import Console

from autotune.display import Progress
from autotune.tuning import TuningEvent, tune
from tests.fake_cluster import FakeCluster
from tests.runner.sim_cluster import tuning_job


def test_every_running_experiment_is_shown(tmp_path: Path) -> None:
    out = io.StringIO()
    progress = Progress(Console(file=out, width=200), quiet=True)
    tables = []

    def watch(event: TuningEvent) -> None:
        progress(event)
        if len(event.running) == 3:  # what the live display would draw now
            tables.append(progress._status(event.summary))

    tune(tuning_job(tmp_path), FakeCluster(fits=3), on_event=watch)
    assert "started (3 running)" in out.getvalue()
    rendered = io.StringIO()
    Console(file=rendered, width=200).print(tables[0])
    shown = [
        line for line in rendered.getvalue().splitlines() if re.search(r"_mbs\S* \(\w+\)", line)
    ]
    assert len(shown) == 3 and shown[0].lstrip().startswith("running")
