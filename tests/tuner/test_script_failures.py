"""Failures that say something about the script, not the config: a loader that runs dry at a
micro-batch bounds every variant; a script that fails alike everywhere ends the run."""

from __future__ import annotations

from dataclasses import replace

from autotune.experiment import ExperimentResult, Status
from autotune.tuner import Candidate, Phase
from autotune.tuner.session import RAN_OUT_OF_DATA, SAME_FAILURE_LIMIT
from tests.tuner.landscape import Landscape, drive
from tests.tuner.test_flow import fast_tuner, true_largest_fit

# The script's dataset holds 19 samples per rank per profile window: 20 or more run dry.
DATA_LIMIT = 20


class DryLoader(Landscape):
    """The landscape, behind a script whose data runs out above ``DATA_LIMIT``."""

    def run(self, candidate: Candidate) -> ExperimentResult:
        if candidate.micro_batch_size >= DATA_LIMIT:
            return ExperimentResult(
                candidate.name,
                Status.error,
                error=f"{RAN_OUT_OF_DATA}: the script finished after 4 optimizer steps, "
                "before end_profile_step (5 steps are needed)",
            )
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
    (why,) = [why for key, why in summary.pruned.items() if key.startswith("micro-batch >=")]
    smallest_dry = min(dry, key=lambda c: c.micro_batch_size).name
    assert "ran out of data" in why and smallest_dry in why


def test_out_of_data_is_known_by_the_runners_exception_type() -> None:
    from autotune.runner.script import ScriptFinishedEarly

    assert ScriptFinishedEarly.__name__ == RAN_OUT_OF_DATA


class Rejects(Landscape):
    """A script whose argparse rejects a mapped flag: every experiment fails alike."""

    error = "ScriptExited: the script exited with status 2: train.py: error: unrecognized "
    error += "arguments: --per_device_train_batch_size 16"

    def __init__(self, status: Status = Status.error, same: bool = True) -> None:
        super().__init__()
        self.status, self.same = status, same

    def run(self, candidate: Candidate) -> ExperimentResult:
        error = self.error if self.same else f"ValueError: bad size {candidate.name}"
        return ExperimentResult(candidate.name, self.status, error=error)


def test_a_script_that_fails_alike_everywhere_ends_the_run_naming_the_error() -> None:
    tuner = fast_tuner(Landscape().budget_bytes, tuner_num_trials=50)
    asked = drive(tuner, Rejects())
    assert len(asked) == SAME_FAILURE_LIMIT and tuner.finished
    summary = tuner.summary()
    assert Rejects.error in summary.stop_reason and summary.num_failed == SAME_FAILURE_LIMIT


def test_failures_that_depend_on_the_config_do_not_end_the_run() -> None:
    for landscape in (Rejects(Status.oom), Rejects(Status.timeout), Rejects(same=False)):
        tuner = fast_tuner(Landscape().budget_bytes, tuner_num_trials=50)
        asked = drive(tuner, landscape)
        assert len(asked) > SAME_FAILURE_LIMIT, landscape.status
        assert "same error" not in tuner.summary().stop_reason


def test_one_ok_experiment_keeps_the_run_going_past_identical_errors() -> None:
    tuner = fast_tuner(Landscape().budget_bytes, tuner_num_trials=50)
    first = tuner.ask()
    assert first is not None
    tuner.tell(replace(Landscape().run(replace(first, name=first.name)), name=first.name))
    asked = drive(tuner, Rejects())
    assert len(asked) > SAME_FAILURE_LIMIT
