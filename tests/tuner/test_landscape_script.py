"""experiments/landscape.py's refinement of a table's top, with a runner that answers from a
fixed table of values (no experiment runs)."""

from __future__ import annotations

import doctest
import json
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from autotune.bench.table import tuning_config
from autotune.experiment import ExperimentResult, ExperimentSpec, Metrics, Status
from tests.experiment_scripts import load_script

# ±5% a measurement; "near" sits on the 2% line, "far" well below it.
MEDIANS = {"z0_mbs4": 100.0, "z1_mbs4": 97.9, "z2_mbs4": 70.0}
SPREAD = (0.95, 1.0, 1.05)


@pytest.fixture(scope="module")
def landscape() -> ModuleType:
    return load_script("landscape")


class MediansRunner:
    """Every experiment measures its configuration's median, spread as SPREAD in turn."""

    def __init__(self) -> None:
        self.ran: list[str] = []

    def run(self, spec: ExperimentSpec) -> ExperimentResult:
        self.ran.append(spec.name)
        factor = SPREAD[self.ran.count(spec.name) % len(SPREAD)]
        value = MEDIANS[spec.name] * factor
        metrics = Metrics.from_window([8 / value], 8, 1e9, peak_memory_bytes=0)
        return ExperimentResult(spec.name, Status.ok, metrics)

    def __enter__(self) -> MediansRunner:
        return self

    def __exit__(self, *exc: object) -> None:
        return None


def write_table(path: Path) -> None:
    configs = {
        name: {
            "overrides": {
                "zero_optimization.stage": int(name[1]),
                "train_micro_batch_size_per_gpu": 4,
            },
            "status": "ok",
            "throughput": [median * f for f in SPREAD],
            "duration_s": [1.0] * 3,
        }
        for name, median in MEDIANS.items()
    }
    how = {
        "workload": "gpt",
        "workload_args": {},
        "world_size": 2,
        "device_memory_bytes": None,
        "config": tuning_config([0, 1, 2], max_micro_batch=4),
        "repeats": 3,
    }
    model_info = {
        "num_params": 1,
        "param_bytes": 4,
        "activation_bytes_per_sample": 1,
        "flops_per_sample": 1.0,
    }
    path.write_text(json.dumps({"how": how, "model_info": model_info, "configs": configs}))


def table_job(tmp_path: Path) -> tuple[Any, Any]:
    """The job and model info of the table :func:`write_table` writes."""
    from autotune.bench.table import landscape_job
    from autotune.profiling.model_info import ModelInfo

    path = tmp_path / "table.json"
    write_table(path)
    table = json.loads(path.read_text())
    return landscape_job(table), ModelInfo(**table["model_info"])


def test_refining_measures_only_the_unresolved_top_until_it_is_resolved(
    landscape: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "table.json"
    write_table(path)
    runner = MediansRunner()
    monkeypatch.setattr(landscape, "_runner", lambda kind, job: runner)
    landscape.refine(path, rounds=3, runner_kind="ray")
    table = json.loads(path.read_text())
    # The far one is resolved from the start; the leader and the one on the line race.
    assert set(runner.ran) == {"z0_mbs4", "z1_mbs4"} and len(runner.ran) == 6
    assert [len(table["configs"][n]["throughput"]) for n in MEDIANS] == [6, 6, 3]
    refined = table["how"]["refined"]
    assert refined["rounds"] == 3 and refined["unresolved_after"] == ["z0_mbs4", "z1_mbs4"]


def test_a_resolved_table_is_left_as_it_is(
    landscape: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "table.json"
    write_table(path)
    table = json.loads(path.read_text())
    table["configs"]["z1_mbs4"]["throughput"] = [80.0 * f for f in SPREAD]  # clearly below
    path.write_text(json.dumps(table))
    runner = MediansRunner()
    monkeypatch.setattr(landscape, "_runner", lambda kind, job: runner)
    landscape.refine(path, rounds=3, runner_kind="ray")
    assert runner.ran == []
    assert json.loads(path.read_text())["how"]["refined"]["rounds"] == 0


def test_the_examples_in_the_script_hold(landscape: ModuleType) -> None:
    failed, attempted = doctest.testmod(landscape)
    assert attempted > 0 and failed == 0


def test_given_sizes_make_a_stage_by_size_grid_and_the_deadline_cuts_the_rounds(
    landscape: ModuleType, tmp_path: Path
) -> None:
    job, info = table_job(tmp_path)
    configs = landscape.sized_grid(job, info, [2, 4])
    assert sorted(configs) == sorted(f"z{s}_mbs{m}" for s in (0, 1, 2) for m in (2, 4))
    assert configs["z1_mbs2"]["train_micro_batch_size_per_gpu"] == 2
    mine = {name: configs[name] for name in MEDIANS}
    runner = MediansRunner()
    measured = landscape.measure(job, info, runner, mine, repeats=2)
    assert [len(runs) for runs in measured.values()] == [2, 2, 2]
    late = landscape.measure(job, info, runner, mine, repeats=2, deadline=0.0)
    assert runner.ran.count("z0_mbs4") == 2 and all(runs == [] for runs in late.values())


class FitsUpTo:
    """Micro-batches up to ``largest`` run (stage 2 one fewer); above, out of memory."""

    def __init__(self, largest: int) -> None:
        self.largest, self.ran = largest, []

    def run(self, spec: ExperimentSpec) -> ExperimentResult:
        self.ran.append(spec.name)
        stage, size = (int(part) for part in spec.name[1:].split("_mbs"))
        if size > self.largest - (stage == 2):
            return ExperimentResult(spec.name, Status.oom, error="CUDA out of memory")
        metrics = Metrics.from_window([8 / size], 8, 1e9, peak_memory_bytes=0)
        return ExperimentResult(spec.name, Status.ok, metrics)


def test_sizes_past_the_fit_cost_one_failed_experiment_a_variant(
    landscape: ModuleType, tmp_path: Path
) -> None:
    job, info = table_job(tmp_path)
    configs = landscape.sized_grid(job, info, [1, 2, 4, 5, 6, 7, 8])
    runner = FitsUpTo(5)
    measured = landscape.measure(job, info, runner, configs, repeats=2)
    failed = [name for name in runner.ran if name.endswith(("mbs6", "mbs7", "mbs8"))]
    # One failure a stage, where it first fails (stage 2 one size sooner), run once.
    assert sorted(failed) == ["z0_mbs6", "z1_mbs6"] and runner.ran.count("z2_mbs5") == 1
    assert all(len(measured[f"z{s}_mbs4"]) == 2 for s in (0, 1, 2))
    assert measured["z2_mbs6"] == [] and len(measured["z0_mbs5"]) == 2


def test_merging_adds_another_sessions_configurations_and_says_which_came_from_where(
    landscape: ModuleType, tmp_path: Path
) -> None:
    first, second = tmp_path / "first.json", tmp_path / "second.json"
    for path, when in ((first, "morning"), (second, "evening")):
        write_table(path)
        table = json.loads(path.read_text())
        table["how"] |= {"measured_at": when, "wall_s": 1.0}
        path.write_text(json.dumps(table))
    table = json.loads(second.read_text())
    table["configs"] = {
        "z0_mbs8": {
            "overrides": {"zero_optimization.stage": 0, "train_micro_batch_size_per_gpu": 8},
            "status": "oom",
            "throughput": [],
            "duration_s": [1.0],
        },
        "z0_mbs4": {**table["configs"]["z0_mbs4"], "throughput": [1.0]},  # first's is kept
    }
    second.write_text(json.dumps(table))
    landscape.merge(first, second)
    merged = json.loads(first.read_text())
    assert merged["configs"]["z0_mbs8"]["status"] == "oom"
    assert merged["configs"]["z0_mbs4"]["throughput"] == [100.0 * f for f in SPREAD]
    sessions = merged["how"]["sessions"]
    assert [(s["measured_at"], s["micro_batches"]) for s in sessions] == [
        ("morning", [4]),
        ("evening", [8]),
    ]
    table["how"]["world_size"] = 4
    second.write_text(json.dumps(table))
    with pytest.raises(SystemExit, match="world_size"):
        landscape.merge(first, second)
