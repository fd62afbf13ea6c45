"""A loser stopped early (``ExperimentSpec.stop_above_step_s``): the window ends after the
first timed step slower than the threshold, on every way a rank measures (the workload path
and script mode, each on the built-in engine and on DeepSpeed), every rank at the same step."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from autotune.experiment import ExperimentResult, ExperimentSpec, Status
from autotune.runner.ray_runner import RayRunner
from tests.deepspeed_installed import needs_deepspeed
from tests.runner.specs import script_spec, spec

pytestmark = [pytest.mark.ray, pytest.mark.multirank]

PATHS = [
    pytest.param("builtin", "workload", id="builtin-workload"),
    pytest.param("builtin", "script", id="builtin-script"),
    pytest.param("deepspeed", "workload", id="deepspeed-workload", marks=needs_deepspeed),
    pytest.param("deepspeed", "script", id="deepspeed-script", marks=needs_deepspeed),
]


@pytest.fixture(scope="module")
def runner(ray_cluster: str) -> Iterator[RayRunner]:
    with RayRunner() as runner:
        yield runner


def experiment(name: str, engine: str, target: str, folder: Path, **kw: Any) -> ExperimentSpec:
    kw = {"engine": engine, "timeout_s": 90, **kw}
    return script_spec(name, folder, **kw) if target == "script" else spec(name, **kw)


def timed_steps(result: ExperimentResult) -> int:
    assert result.status is Status.ok, (result.error, result.error_detail)
    assert result.metrics is not None
    return len(result.metrics.step_times_s)


@pytest.mark.parametrize(("engine", "target"), PATHS)
def test_a_window_slower_than_the_threshold_ends_after_its_first_timed_step(
    runner: RayRunner, engine: str, target: str, tmp_path: Path
) -> None:
    stopped = runner.run(experiment("loser", engine, target, tmp_path, stop_above_step_s=1e-9))
    assert timed_steps(stopped) == 1
    assert stopped.stopped_after_steps == 1
    metrics = stopped.metrics
    assert metrics is not None
    assert metrics.latency == metrics.step_times_s[0]
    assert metrics.throughput * metrics.latency == pytest.approx(8)
    assert metrics.flops > 0 and metrics.peak_memory_bytes > 0
    assert 0 < stopped.timings.window_s < 10 * metrics.latency + 1

    # A threshold never reached: every step is checked (every rank agreeing), none stops it.
    kept = runner.run(experiment("contender", engine, target, tmp_path, stop_above_step_s=1e9))
    assert (timed_steps(kept), kept.stopped_after_steps) == (3, None)
    whole = runner.run(experiment("unbounded", engine, target, tmp_path))
    assert (timed_steps(whole), whole.stopped_after_steps) == (3, None)


def test_a_script_window_from_step_one_still_counts_its_flops_when_stopped(
    runner: RayRunner, tmp_path: Path
) -> None:
    # FLOPs are counted on the step after the window when the window starts at step 1: a
    # window ended early counts them on the step after the one it ended at.
    loser = script_spec(
        "from_one", tmp_path, start_profile_step=1, end_profile_step=3, stop_above_step_s=1e-9
    )
    result = runner.run(loser)
    assert timed_steps(result) == 1 and result.stopped_after_steps == 1
    assert result.metrics is not None and result.metrics.flops > 0


@pytest.mark.parametrize("engine", ["builtin", pytest.param("deepspeed", marks=needs_deepspeed)])
def test_a_script_whose_flops_the_job_knows_counts_none_and_runs_no_step_more(
    runner: RayRunner, engine: str, tmp_path: Path
) -> None:
    # Data for three optimizer steps (24 samples, 2 ranks x micro-batch 2 x accumulation 2),
    # the window steps 1-3: counting FLOPs would take a fourth step, after the window.
    known = script_spec(
        "known",
        tmp_path,
        start_profile_step=1,
        end_profile_step=3,
        flops_per_sample=1234.0,
        engine=engine,
        timeout_s=90,
    )
    assert known.script is not None
    args = (*known.script.args, "--num_samples", "24", "--num_train_epochs", "1")
    result = runner.run(replace(known, script=replace(known.script, args=args)))
    assert timed_steps(result) == 3
    assert result.metrics is not None
    assert result.metrics.flops_per_step == 1234.0 * 4  # the job's, not counted again


def test_the_fields_round_trip_through_their_records() -> None:
    loser = spec("loser", stop_above_step_s=0.25)
    assert ExperimentSpec.from_dict(loser.to_dict()) == loser
    assert ExperimentSpec.from_dict(
        {k: v for k, v in loser.to_dict().items() if k != "stop_above_step_s"}
    ) == spec("loser")
    result = ExperimentResult("loser", Status.ok, stopped_after_steps=2)
    assert ExperimentResult.from_dict(result.to_dict()).stopped_after_steps == 2
    written_before = {k: v for k, v in result.to_dict().items() if k != "stopped_after_steps"}
    assert ExperimentResult.from_dict(written_before).stopped_after_steps is None
