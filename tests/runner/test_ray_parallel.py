"""Experiments side by side on a simulated two-node cluster (4 logical GPUs per node): as
many run at once as fit, each on GPUs of its own, the same experiments as one at a time, a
run killed with several in flight loses nothing and runs nothing twice, and a node that leaves
fails only the experiments that had ranks on it.

Ranks sleep instead of training (:mod:`tests.runner.sim_cluster`), so four experiments at once
cost no more CPU than one. One run is killed with -9 and resumed to the end; the tests read
what the two drivers left behind.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from itertools import combinations
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from autotune.experiment import ExperimentResult, ExperimentSpec, Status
from autotune.results import load_results
from autotune.tuning import tune
from tests.cli_process import finished_names
from tests.runner.sim_cluster import (
    SimulatedCluster,
    config_metrics,
    simulated_cluster,
    tune_command,
    tuning_job,
)

pytestmark = [pytest.mark.ray, pytest.mark.slow]
NODES, GPUS_PER_NODE = 2, 4  # world size 2: two experiments per node, four in all


class _InstantRunner:
    """The same metrics as the cluster's sleeping ranks, one experiment at a time, no Ray."""

    def run(self, spec: ExperimentSpec) -> ExperimentResult:
        return ExperimentResult(spec.name, Status.ok, config_metrics(spec), started_at="")


@dataclass(frozen=True)
class KilledAndResumed:
    results_dir: Path
    placements: list[dict[str, Any]]  # one per rank of every experiment that ran
    capacity: dict[str, int]  # as the resumed driver saw it, by world size
    cut_off: list[str]  # running when the first driver was killed
    finished_at_kill: list[str]
    names: list[str]  # the log after the resumed run


@pytest.fixture(scope="module")
def sequential_names(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    """What a one-at-a-time gridsearch run of the same job runs."""
    results_dir = tmp_path_factory.mktemp("sequential")
    tune(tuning_job(results_dir), _InstantRunner())
    return list(load_results(results_dir)["name"])


@pytest.fixture(scope="module")
def cluster() -> Iterator[SimulatedCluster]:
    with simulated_cluster(NODES, GPUS_PER_NODE, cpus=GPUS_PER_NODE) as running:
        yield running


@pytest.fixture(scope="module")
def killed_and_resumed(
    cluster: SimulatedCluster, tmp_path_factory: pytest.TempPathFactory
) -> KilledAndResumed:
    """A run at the default concurrency, killed with -9 once one experiment has finished and
    at least two are running, then the same command again to the end."""
    scratch = tmp_path_factory.mktemp("parallel")
    results, log_dir = scratch / "results", scratch / "placements"
    log_dir.mkdir()
    command = tune_command(
        cluster.address, results, max_concurrent=None, seconds=1.0, log_dir=log_dir
    )

    killed = cluster.driver(command)
    cut_off = _wait_for_several_in_flight(results, killed)
    killed.send_signal(signal.SIGKILL)
    killed.wait(timeout=30)
    finished_at_kill = finished_names(results)
    resumed = cluster.driver(command)
    out, err = resumed.communicate(timeout=150)
    assert resumed.returncode == 0, err[-3000:]
    return KilledAndResumed(
        results_dir=results,
        placements=[json.loads(path.read_text()) for path in log_dir.glob("*.json")],
        capacity=json.loads(out.strip().splitlines()[-1])["capacity"],
        cut_off=cut_off,
        finished_at_kill=finished_at_kill,
        names=finished_names(results),
    )


def _wait_for_several_in_flight(results: Path, driver: subprocess.Popen[str]) -> list[str]:
    """Wait until an experiment has finished and at least two are running (started: their
    folder has a spec; unfinished: their trial not told); their names."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        assert driver.poll() is None, driver.stderr.read() if driver.stderr else ""
        finished = set(finished_names(results))
        started = {p.name for p in (results / "exps").glob("*") if (p / "spec.json").exists()}
        in_flight = sorted(started - finished)
        if len(in_flight) >= 2 and finished:
            return in_flight
        time.sleep(0.05)
    raise TimeoutError("never saw two experiments in flight")


def _most_at_once(frame: pd.DataFrame) -> int:
    """The most experiments whose [started_at, started_at + duration_s] intervals overlap."""
    starts = frame["started_at"].map(lambda t: t.timestamp())
    ends = [s + d for s, d in zip(starts, frame["duration_s"], strict=True)]
    events = sorted([(s, 1) for s in starts] + [(e, -1) for e in ends])
    running = most = 0
    for _, change in events:  # an end sorts before a start at the same instant
        running += change
        most = max(most, running)
    return most


def test_as_many_run_at_once_as_fit_each_on_its_own_gpus(
    killed_and_resumed: KilledAndResumed, sequential_names: list[str]
) -> None:
    run = killed_and_resumed
    # World size 2 fits a node (STRICT_PACK, two per node); 8 needs both nodes (SPREAD).
    assert run.capacity == {"1": 8, "2": 4, "8": 1}
    frame = load_results(run.results_dir)
    assert sorted(frame["name"]) == sorted(sequential_names)
    assert _most_at_once(frame) == NODES * GPUS_PER_NODE // 2  # the default: all that fit
    assert all(len(set(nodes)) == 1 for nodes in frame["node_ids"])  # a gang on one node

    assert {r["name"] for r in run.placements} >= set(sequential_names)
    assert all(len(r["gpus"]) == 1 for r in run.placements)
    for first, second in combinations(run.placements, 2):
        if first["start"] < second["end"] and second["start"] < first["end"]:
            # Side by side: never the same GPU, and each experiment its own placement group
            # (its CPUs); the two ranks of one experiment share the group, on one node.
            assert (first["node"], first["gpus"]) != (second["node"], second["gpus"])
            same = first["name"] == second["name"]
            assert (first["placement_group"] == second["placement_group"]) == same
            assert first["node"] == second["node"] or not same


def test_kill_9_with_several_in_flight_loses_nothing_and_runs_nothing_twice(
    killed_and_resumed: KilledAndResumed, sequential_names: list[str]
) -> None:
    run = killed_and_resumed
    assert len(run.names) == len(set(run.names)), "an experiment ran twice"
    assert run.names[: len(run.finished_at_kill)] == run.finished_at_kill  # only appended to
    assert set(run.cut_off) <= set(run.names[len(run.finished_at_kill) :]), "one was lost"
    assert sorted(run.names) == sorted(sequential_names)
    summary = json.loads((run.results_dir / "summary.json").read_text())
    assert summary["num_run"] == len(run.names)


def test_a_node_that_leaves_fails_only_the_experiments_on_it(
    cluster: SimulatedCluster, tmp_path: Path
) -> None:
    """Runs last: it takes a node away from the module's cluster."""
    command = [sys.executable, "-m", "tests.runner.sim_cluster", "side-by-side"]
    command += [cluster.address, "--count", "4", "--seconds", "8", "--log-dir", str(tmp_path)]
    driver = cluster.driver(command)
    deadline = time.monotonic() + 120
    while len(list(tmp_path.glob("*.started"))) < 8:  # every rank of the four is sleeping
        assert driver.poll() is None and time.monotonic() < deadline
        time.sleep(0.1)
    gone = cluster.remove_worker_node()
    out, err = driver.communicate(timeout=120)
    assert driver.returncode == 0, err[-3000:]
    # Ray tells the driver about the lost node on the same stdout.
    report = json.loads(next(line for line in out.splitlines() if line.startswith('{"results"')))
    on_gone = [r for r in report["results"] if gone in r["nodes"]]
    elsewhere = [r for r in report["results"] if gone not in r["nodes"]]
    assert len(on_gone) == len(elsewhere) == 2
    assert all(r["status"] == "error" and "RankDied" in r["error"] for r in on_gone)
    assert all(r["status"] == "ok" for r in elsewhere)
