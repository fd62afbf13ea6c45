"""A run whose listed micro-batches fail every way an experiment can, on warm Ray actors: each
size is run and recorded with its own status (an error or a timeout says nothing about the
sizes above it), the winner is one that ran ok, and the end of the run lists what did not run.

One rank: each failure is the experiment's own whatever the world size (a failed rank's peers
being released is tests/runner/test_ray_runner.py's), and a gang replaced after a death is then
one process, not two."""

from __future__ import annotations

from pathlib import Path

import pytest
from rich.console import Console

from autotune.config import load_config
from autotune.display import print_report
from autotune.job import TuningJob
from autotune.runner.ray_runner import RayRunner
from autotune.tuning import tune

pytestmark = pytest.mark.ray

FAULTS = {"2": "raise", "3": "hang", "5": "kill", "6": "segfault", "7": "oom"}
EXPECTED = {1: "ok", 2: "error", 3: "timeout", 4: "ok", 5: "error", 6: "error", 7: "oom"}


@pytest.mark.slow
def test_every_listed_micro_batch_runs_and_fails_on_its_own(
    ray_cluster: str, tmp_path: Path
) -> None:
    config = load_config(
        {
            "train_micro_batch_size_per_gpu": [1, 2, 3, 4, 5, 6, 7],
            "gradient_accumulation_steps": 1,
            "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
            "zero_optimization": {"stage": 0},
            "autotuning": {
                "tuner_type": "gridsearch",
                "start_profile_step": 2,
                "end_profile_step": 3,
                "timeout_s": 10,
                "num_remeasure": 1,
            },
        },
        world_size=1,
    )
    job = TuningJob(
        config=config,
        workload="tests.runner.faulty_workloads:faulty_by_micro_batch",
        workload_args={"faults": FAULTS, "rank_to_fail": 0},
        results_dir=tmp_path,
    )
    with RayRunner() as runner:
        report = tune(job, runner)
    summary = report.summary
    first_runs = {
        int(name.removeprefix("z0_mbs")): why.split(":")[0]
        for name, why in summary.failed.items()
        if "_r" not in name
    }
    ok = {int(r.name.removeprefix("z0_mbs")): "ok" for r in summary.ranking}
    assert {**first_runs, **ok} == EXPECTED, summary.failed
    assert summary.best is not None and summary.best.name in ("z0_mbs1", "z0_mbs4")
    assert summary.not_run == {}
    console = Console(record=True, width=120)
    print_report(console, report)
    assert "not run: 0 configurations" in console.export_text()
