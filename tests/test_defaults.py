"""Every default has one source: what a no-flag ``autotune run`` tunes, and where its results
go, come from autotune/defaults.py and the config's ``autotuning`` section, and each
experiment's settings from the job."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

import autotune.tuning
from autotune.cli import app
from autotune.config import AutotuningConfig, load_config
from autotune.defaults import (
    DEFAULT_CONFIG,
    DEFAULT_CPUS_PER_RANK,
    DEFAULT_WORKLOAD,
    DEFAULT_WORLD_SIZE,
)
from autotune.job import TuningJob, experiment_spec
from autotune.tuner import Candidate, Phase


class _Captured(Exception):
    """Stops ``autotune run`` at ``tune``, carrying the job it was given."""


def _job_of(monkeypatch: pytest.MonkeyPatch, *args: str) -> TuningJob:
    """The job ``autotune run ARGS`` would tune (nothing runs)."""

    def capture(job: TuningJob, *_: object, **__: object) -> None:
        raise _Captured(job)

    monkeypatch.setattr(autotune.tuning, "tune", capture)
    result = CliRunner().invoke(app, ["run", "--runner", "local", *args])
    assert isinstance(result.exception, _Captured), result.output
    job: TuningJob = result.exception.args[0]
    return job


def test_a_run_without_flags_takes_each_default_from_its_one_source(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    job = _job_of(monkeypatch)
    tuning = job.config.autotuning
    assert "results_dir" not in DEFAULT_CONFIG["autotuning"]
    assert job.results_path == Path(AutotuningConfig().results_dir) == Path("autotuning_results")
    assert (job.workload, job.world_size, job.cpus_per_rank) == (
        DEFAULT_WORKLOAD,
        DEFAULT_WORLD_SIZE,
        DEFAULT_CPUS_PER_RANK,
    )
    built_in = DEFAULT_CONFIG["autotuning"]
    assert (tuning.start_profile_step, tuning.end_profile_step, tuning.timeout_s) == (
        built_in["start_profile_step"],
        built_in["end_profile_step"],
        built_in["timeout_s"],
    )


def test_an_experiment_takes_every_setting_from_its_job(tmp_path: Path) -> None:
    config = load_config(
        {
            "train_micro_batch_size_per_gpu": 4,
            "autotuning": {
                "start_profile_step": 4,
                "end_profile_step": 9,
                "timeout_s": 77,
                "seed": 5,
                "results_dir": str(tmp_path / "configured"),
            },
        },
        world_size=3,
    )
    job = TuningJob(config, "mlp", {"d_in": 8}, device_memory_bytes=2**30, cpus_per_rank=2)
    micro = {"train_micro_batch_size_per_gpu": 4}
    candidate = Candidate("z1_mbs4", micro, micro, Phase.micro_batch)
    spec = experiment_spec(job, candidate, flops_per_sample=None)
    assert (spec.workload, dict(spec.workload_args), spec.world_size) == ("mlp", {"d_in": 8}, 3)
    assert (spec.start_profile_step, spec.end_profile_step, spec.timeout_s, spec.seed) == (
        4,
        9,
        77,
        5,
    )
    assert (spec.cpus_per_rank, spec.device_memory_bytes) == (2, 2**30)
    assert job.results_path == tmp_path / "configured"
    assert TuningJob(config, results_dir=tmp_path / "flag").results_path == tmp_path / "flag"
