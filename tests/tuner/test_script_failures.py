"""Failures that say something about the script, not the config: a loader that runs dry at a
micro-batch bounds every variant; a script that fails alike everywhere ends the run."""

from __future__ import annotations

import zlib
from collections.abc import Callable

import pytest

from autotune.experiment import ExperimentResult, Status
from autotune.summary_text import not_run_texts, stop_text
from autotune.tuner import Candidate, Phase
from autotune.tuner.stopping import SAME_FAILURE_LIMIT
from tests.tuner.landscape import Landscape, drive, true_largest_fit
from tests.tuner.tuners import fast_tuner

# The script's loader has too few batches for the profile window at micro-batch 20 and up.
DATA_LIMIT = 20


def out_of_data(candidate: Candidate) -> ExperimentResult:
    """What the runner records for a script whose loader ran dry before the window ended:
    80 samples per rank, so fewer steps the larger the micro-batch."""
    steps = 80 // candidate.micro_batch_size
    return ExperimentResult(
        candidate.name,
        Status.error,
        error=f"ScriptFinishedEarly: the script finished after {steps} optimizer steps, before "
        "end_profile_step (5 steps are needed)",
        ended_after_steps=steps,
    )


class DryLoader(Landscape):
    """The landscape, behind a script whose data runs out at ``DATA_LIMIT`` and above."""

    def run(self, candidate: Candidate) -> ExperimentResult:
        if candidate.micro_batch_size >= DATA_LIMIT:
            return out_of_data(candidate)
        return super().run(candidate)


def test_running_out_of_data_bounds_the_micro_batch_of_every_variant() -> None:
    landscape = DryLoader()
    tuner = fast_tuner(landscape.budget_bytes, tuner_early_stopping=99)
    asked = drive(tuner, landscape)
    dry = [c for c in asked if c.micro_batch_size >= DATA_LIMIT]
    # Only the first variant's search meets the bound; the others start below it.
    assert len({c.stage for c in dry}) == 1, [c.name for c in dry]
    for stage in range(4):
        assert true_largest_fit(landscape, stage) >= DATA_LIMIT  # memory is not the bound
        probes = [c for c in asked if c.stage == stage and c.phase is Phase.max_micro_batch]
        assert max(c.micro_batch_size for c in probes if landscape.run(c).ok) == DATA_LIMIT - 1
    summary = tuner.summary()
    assert set(summary.best_per_variant) == {"z0", "z1", "z2", "z3"}
    (why,) = [
        why for key, why in not_run_texts(summary).items() if key.startswith("micro-batch >=")
    ]
    smallest_dry = min(dry, key=lambda c: c.micro_batch_size).name
    assert "runs out of data" in why and smallest_dry in why


# A rank's share of the data of a client that repeats samples to fill a larger micro-batch.
SAMPLES_PER_RANK = 13


class RepeatingLoader(Landscape):
    """The landscape, behind an Accelerate client: a micro-batch over a rank's share of the
    data is refused at its first step, saying the share."""

    def run(self, candidate: Candidate) -> ExperimentResult:
        if candidate.micro_batch_size > SAMPLES_PER_RANK:
            return ExperimentResult(
                candidate.name,
                Status.error,
                error=f"MicroBatchOverData: micro-batch {candidate.micro_batch_size} is more "
                f"than a rank's share of the data ({SAMPLES_PER_RANK} of 26 samples over 2 ranks)",
                ended_after_steps=0,
                samples_per_rank=SAMPLES_PER_RANK,
            )
        return super().run(candidate)


def test_a_micro_batch_over_the_data_share_bounds_every_size_over_the_share() -> None:
    """One refusal says where the data ends: the search does not walk down from it size by
    size (it did: 1024, 512, 256, 255, 254, ... over a share of 128)."""
    landscape = RepeatingLoader()
    tuner = fast_tuner(landscape.budget_bytes, tuner_early_stopping=99)
    asked = drive(tuner, landscape)
    over = [c.micro_batch_size for c in asked if c.micro_batch_size > SAMPLES_PER_RANK]
    assert len(over) <= 2, over  # the first refusal, and at most one before it
    for stage in range(4):
        assert true_largest_fit(landscape, stage) >= SAMPLES_PER_RANK
        probes = [c for c in asked if c.stage == stage and c.phase is Phase.max_micro_batch]
        assert max(c.micro_batch_size for c in probes if landscape.run(c).ok) == SAMPLES_PER_RANK
    (why,) = [
        why for key, why in not_run_texts(tuner.summary()).items()
        if key.startswith("micro-batch >=")
    ]  # fmt: skip
    assert f"micro-batch {SAMPLES_PER_RANK + 1} " in why


def test_a_script_with_a_step_limit_of_its_own_ends_the_run_saying_so() -> None:
    """Ending after as many steps at twice the micro-batch is no data bound (that would halve
    them): the script stops itself (--max_steps), whatever the config."""

    class StepLimited(Landscape):
        def run(self, candidate: Candidate) -> ExperimentResult:
            return ExperimentResult(
                candidate.name,
                Status.error,
                error="ScriptFinishedEarly: ...",
                ended_after_steps=4,
            )

    tuner = fast_tuner(Landscape().budget_bytes, tuner_num_trials=50)
    asked = drive(tuner, StepLimited())
    assert len(asked) == 2 and tuner.finished
    summary = tuner.summary()
    assert "ends after 4 optimizer steps whatever the micro-batch" in stop_text(summary.stop)
    assert not any(key.startswith("micro-batch >=") for key in not_run_texts(summary))


def argparse_exit(candidate: Candidate) -> str:
    """What a script whose argparse rejects the mapped flag fails with: the value varies."""
    return (
        "ScriptExited: the script exited with status 2: train.py: error: unrecognized "
        f"arguments: --per_device_train_batch_size {candidate.micro_batch_size}"
    )


class Failing(Landscape):
    """Every experiment fails, with ``status`` and the error ``error_of`` says."""

    def __init__(self, error_of: Callable[[Candidate], str], status: Status = Status.error):
        super().__init__()
        self.error_of, self.status = error_of, status

    def run(self, candidate: Candidate) -> ExperimentResult:
        return ExperimentResult(candidate.name, self.status, error=self.error_of(candidate))


class RunsDry(Landscape):
    """Every experiment's script runs out of data."""

    error_of = staticmethod(lambda candidate: out_of_data(candidate).error or "")

    def run(self, candidate: Candidate) -> ExperimentResult:
        return out_of_data(candidate)


def never_initialized(candidate: Candidate) -> str:
    """What the runner records for a script that never builds an engine."""
    from autotune.runner.script import ScriptNeverInitialized

    return f"{ScriptNeverInitialized.__name__}: the script finished without calling initialize()"


def rank_lost(candidate: Candidate) -> str:
    """An infrastructure failure as Ray reports it: an actor id and an address of its own in
    every experiment (the run from a folder that shadowed the package, issue 43)."""
    seed = zlib.crc32(candidate.name.encode())
    return (
        f"infrastructure: RankLost: rank 1 actor was lost before the experiment began "
        f"(actor {seed:08x}{seed:08x}e0c1 died; object at 0x7efd{seed % 65536:04x}abc10)"
    )


@pytest.mark.parametrize("error_of", [argparse_exit, never_initialized, rank_lost])
def test_a_script_that_fails_alike_everywhere_ends_the_run_naming_the_error(
    error_of: Callable[[Candidate], str],
) -> None:
    tuner = fast_tuner(Landscape().budget_bytes, tuner_num_trials=50)
    asked = drive(tuner, Failing(error_of))
    assert len(asked) == SAME_FAILURE_LIMIT and tuner.finished
    summary = tuner.summary()
    assert error_of(asked[0]) in stop_text(summary.stop)
    assert summary.num_failed == SAME_FAILURE_LIMIT and summary.best is None


def test_failures_that_depend_on_the_config_do_not_end_the_run() -> None:
    different = iter(["ValueError: shapes differ", "KeyError: 'labels'"] * 50)
    cases = [
        Failing(argparse_exit, Status.oom),
        Failing(argparse_exit, Status.timeout),
        RunsDry(),  # bounds the micro-batch: smaller ones may run
        Failing(lambda candidate: next(different)),
    ]
    for landscape in cases:
        tuner = fast_tuner(Landscape().budget_bytes, tuner_num_trials=50)
        asked = drive(tuner, landscape)
        assert len(asked) > SAME_FAILURE_LIMIT, landscape.error_of(asked[0])
        assert "same error" not in stop_text(tuner.summary().stop)


def test_one_ok_experiment_keeps_the_run_going_past_identical_errors() -> None:
    tuner = fast_tuner(Landscape().budget_bytes, tuner_num_trials=50)
    first = tuner.ask()
    assert first is not None
    tuner.tell(Landscape().run(first))
    asked = drive(tuner, Failing(argparse_exit))
    assert len(asked) > SAME_FAILURE_LIMIT


def test_a_micro_batch_that_ran_ok_somewhere_is_not_bounded_by_an_early_end() -> None:
    """One variant's run ended early at a size another ran ok at: the data suffices there, so
    that end says nothing about the micro-batch and bounds no other variant."""
    landscape = Landscape()
    tuner = fast_tuner(landscape.budget_bytes, tuner_early_stopping=99)
    first = tuner.ask()
    assert first is not None and first.stage == 0
    tuner.tell(landscape.run(first))
    assert landscape.run(first).ok
    probes, ended_early = [], []
    while (candidate := tuner.ask()) is not None:
        if candidate.stage == 1 and candidate.micro_batch_size == first.micro_batch_size:
            ended_early.append(candidate.name)
            tuner.tell(out_of_data(candidate))
            continue
        probes.append(candidate)
        tuner.tell(landscape.run(candidate))
    assert max(c.micro_batch_size for c in probes if c.stage == 2 and landscape.run(c).ok) == (
        true_largest_fit(landscape, 2)
    )
    not_run = not_run_texts(tuner.summary())
    assert ended_early and not any(k.startswith("micro-batch >=") for k in not_run)
