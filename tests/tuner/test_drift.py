"""A machine that changes under a run: a busy stretch at the start, in the middle or over the
re-measurements must not decide which ZeRO stage wins, nor how fast each is reported.

The fake machine's stages differ by 9-20% and a measurement varies by 2%; a busy stretch runs
everything at 0.65 of its speed (one busy process on the two cores the ranks use). Where the
ranks could see the competition (CPU: the rank measures its node's CPU, see
``autotune.profiling.interference``), the measurements are flagged; where they could not (a
GPU's clocks), the control (the first configuration, measured again through the run) sees the
machine slow down, and what ran meanwhile is measured again where it could matter.
"""

from __future__ import annotations

import math
import random
import zlib
from dataclasses import dataclass, replace

import pytest

from autotune.config import load_config
from autotune.experiment import ExperimentResult, Metrics, Status
from autotune.summary_text import notes
from autotune.tuner import Candidate, Tuner
from autotune.tuner.ranking import TOLERANCE
from autotune.tuner.remeasure import MAX_MEASUREMENTS
from tests.tuner.landscape import MODEL

STAGE_SPEED = {0: 100.0, 1: 120.0, 2: 110.0, 3: 90.0}  # samples/s at a large micro-batch
TRUE_ORDER = ["z1", "z2", "z0", "z3"]
LARGEST_FIT = 16
NOISE = 0.02
BUSY_SPEED = 0.65


def true_throughput(stage: int, micro: int) -> float:
    return STAGE_SPEED[stage] * micro / (micro + 4)


@dataclass
class DriftingMachine:
    """Runs experiment ``i`` at BUSY_SPEED when ``busy_from <= i < busy_until``; ``seen``:
    whether the ranks could tell (their node's CPU showed the competition)."""

    busy_from: int = 0
    busy_until: int = 0
    seen: bool = True
    seed: int = 0
    count: int = 0

    def run(self, candidate: Candidate) -> ExperimentResult:
        index, self.count = self.count, self.count + 1
        micro = candidate.micro_batch_size
        if micro > LARGEST_FIT:
            return ExperimentResult(candidate.name, Status.oom, error="OutOfMemoryError")
        busy = self.busy_from <= index < self.busy_until
        rng = random.Random(zlib.crc32(f"{self.seed}/{candidate.name}".encode()))
        speed = true_throughput(candidate.stage, micro) * math.exp(rng.gauss(0.0, NOISE))
        speed *= BUSY_SPEED if busy else 1.0
        batch = micro * 2
        metrics = Metrics.from_window([batch / speed] * 3, batch, 1e12, 2**20 * micro)
        oversubscribed = 1 / BUSY_SPEED - 1 if busy and self.seen else 0.0
        return ExperimentResult(
            candidate.name, Status.ok, replace(metrics, oversubscription=oversubscribed)
        )


def tune(tuner_type: str, machine: DriftingMachine) -> tuple[Tuner, int]:
    config = load_config(
        {
            "zero_optimization": {"stage": "all"},
            "autotuning": {
                "tuner_type": tuner_type,
                "max_train_micro_batch_size_per_gpu": 32,
                "num_remeasure": 2,
                "seed": machine.seed,
            },
        },
        world_size=2,
    )
    tuner = Tuner(config, MODEL, device_memory_bytes=None)
    asked = 0
    while (candidate := tuner.ask()) is not None:
        tuner.tell(machine.run(candidate))
        asked += 1
        assert asked < 200
    return tuner, asked


def assert_as_on_a_quiet_machine(tuner: Tuner) -> None:
    """The stages rank in their true order, the winner is the true best, and every stage's
    reported best is what a quiet machine measures of that configuration (model_based need
    not search a stage that cannot win to its largest micro-batch: it reports what it ran)."""
    summary = tuner.summary()
    variants = list(summary.best_per_variant)
    assert variants == TRUE_ORDER, {v: r.name for v, r in summary.best_per_variant.items()}
    optimum = true_throughput(1, LARGEST_FIT)
    assert summary.best is not None and summary.best.name.startswith("z1_")
    best_micro = int(summary.best.name.split("_mbs")[1])
    assert true_throughput(1, best_micro) >= optimum * (1 - TOLERANCE), summary.best
    for variant, ranked in summary.best_per_variant.items():
        micro = int(ranked.name.split("_mbs")[1])
        assert ranked.value >= true_throughput(int(variant[1]), micro) * (1 - 3 * NOISE), (
            variant,
            ranked,
        )


def test_the_quiet_machine_ranks_the_stages_in_their_true_order(tuner_type: str) -> None:
    tuner, _ = tune(tuner_type, DriftingMachine())
    assert_as_on_a_quiet_machine(tuner)


@pytest.mark.parametrize(("busy_from", "busy_until"), [(0, 6), (5, 14), (12, 22), (18, 30)])
def test_a_busy_stretch_the_ranks_saw_does_not_decide_the_ranking(
    tuner_type: str, busy_from: int, busy_until: int
) -> None:
    """At the start (the cluster's start-up), over one stage's search, across two stages, and
    over the re-measurements themselves."""
    for seed in range(3):
        machine = DriftingMachine(busy_from, busy_until, seen=True, seed=seed)
        tuner, _ = tune(tuner_type, machine)
        assert_as_on_a_quiet_machine(tuner)


@pytest.mark.parametrize(("busy_from", "busy_until"), [(0, 6), (5, 14)])
def test_a_slow_stretch_no_rank_could_see_is_found_by_the_control_and_measured_again(
    tuner_type: str, busy_from: int, busy_until: int
) -> None:
    for seed in range(3):
        machine = DriftingMachine(busy_from, busy_until, seen=False, seed=seed)
        tuner, _ = tune(tuner_type, machine)
        assert_as_on_a_quiet_machine(tuner)


def test_competition_that_never_ends_is_measured_a_bounded_number_of_times(
    tuner_type: str,
) -> None:
    busy, busy_count = tune(tuner_type, DriftingMachine(0, 10_000, seen=True))
    quiet, quiet_count = tune(tuner_type, DriftingMachine())
    summary = busy.summary()
    assert busy.finished
    # Measuring again on a machine that stays busy meets the same busy machine: the run
    # re-measures about as much as a quiet one does (issue: 26 of 30 experiments were).
    assert all(r.num_measurements <= MAX_MEASUREMENTS for r in summary.ranking)
    assert summary.num_remeasured <= quiet.summary().num_remeasured + 2, (
        summary.num_remeasured,
        quiet.summary().num_remeasured,
    )
    assert busy_count <= quiet_count + 2
    said = " ".join(notes(summary))
    assert "busy throughout" in said and "contenders were measured again" not in said
    assert summary.best is not None and summary.best.disturbed
    assert (
        summary.num_disturbed
        == summary.num_run - summary.num_failed
        == busy_count - summary.num_failed
    )
    assert summary.disturbed_only
