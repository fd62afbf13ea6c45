"""Resuming: a new tuner on the run's study continues where the old one stopped."""

from __future__ import annotations

import pytest
from optuna.trial import TrialState

from autotune.experiment import ExperimentResult
from autotune.tuner import Candidate, Tuner
from autotune.tuner.trials import DS_CONFIG_ATTR, result_attrs, state_of
from tests.tuner.landscape import FakeClock, Landscape, Tied, drive
from tests.tuner.tuners import small_tuner, stored_study


def run_some(tuner: Tuner, landscape: Landscape, count: int) -> list[ExperimentResult]:
    log = []
    for _ in range(count):
        candidate = tuner.ask()
        assert candidate is not None
        log.append(landscape.run(candidate))
        tuner.tell(log[-1])
    return log


@pytest.mark.parametrize("interrupt_after", [1, 5, 9, 14])
def test_a_tuner_on_the_same_study_continues_the_same_search(
    tuner_type: str, interrupt_after: int
) -> None:
    landscape = Landscape(noise=0.05)
    whole = [c.name for c in drive(small_tuner(tuner_type), landscape)]
    interrupt_after = min(interrupt_after, len(whole) - 1)

    record = stored_study()
    log = run_some(small_tuner(tuner_type, study=record()), landscape, interrupt_after)
    resumed = small_tuner(tuner_type, study=record())  # replays the study first
    rest = [c.name for c in drive(resumed, landscape)]

    names = [r.name for r in log] + rest
    assert len(set(names)) == len(names), "a finished experiment ran again"
    assert names == whole  # every decision follows from the results: the uninterrupted run
    assert resumed.finished and resumed.summary().num_run == len(names)
    trials = record().trials
    assert [t.user_attrs["name"] for t in trials] == names  # one trial per experiment
    assert [t.number for t in trials] == list(range(len(names)))


def test_an_experiment_in_flight_when_interrupted_is_proposed_again_as_its_trial(
    tuner_type: str,
) -> None:
    landscape = Landscape()
    record = stored_study()
    first = small_tuner(tuner_type, study=record())
    run_some(first, landscape, 3)
    lost: Candidate | None = first.ask()  # launched, then the driver died
    assert lost is not None and record().trials[-1].state is TrialState.RUNNING
    resumed = small_tuner(tuner_type, study=record())
    later = drive(resumed, landscape)
    assert later[0].name == lost.name and later[0].number == lost.number == 3
    trial = record().trials[3]
    assert trial.user_attrs["name"] == lost.name and trial.state is not TrialState.RUNNING


def test_a_result_told_without_being_asked_for_is_recorded_as_a_finished_trial() -> None:
    landscape = Landscape()
    log = run_some(small_tuner("gridsearch"), landscape, 2)
    other = small_tuner("gridsearch")
    for result in log:
        other.tell(result)
    assert [t.user_attrs["name"] for t in other.study.trials] == [r.name for r in log]
    assert other.summary().num_run == 2


def test_replayed_time_counts_toward_the_budget() -> None:
    landscape, clock = Tied(duration_s=10.0), FakeClock()  # a best in doubt: room kept
    record = stored_study()
    run_some(small_tuner("gridsearch", study=record()), landscape, 4)
    resumed = small_tuner("gridsearch", clock=clock, time_budget_s=65.0, study=record())
    assert resumed.summary().tuning_time_s == 40.0
    # 25 s left: one more search experiment, then a re-measurement of the best (10 s each).
    assert [c.repeat_of is None for c in drive(resumed, landscape, clock=clock)] == [True, False]


def test_a_trial_the_kill_left_before_it_was_named_is_failed_and_taken_by_nothing(
    tuner_type: str,
) -> None:
    # A trial is created, then named, in separate writes: a kill -9 between them leaves a
    # trial with no experiment (running; or waiting, where a re-measurement's parameters
    # were queued), which the next trial asked must not take up.
    landscape = Landscape()
    whole = [c.name for c in drive(small_tuner(tuner_type), landscape)]
    record = stored_study()
    log = run_some(small_tuner(tuner_type, study=record()), landscape, 2)
    study = record()
    study.enqueue_trial({"zero_stage": 3, "micro_batch_size": 7})
    study.ask()  # the queued trial, running, never named
    study.enqueue_trial({"zero_stage": 3, "micro_batch_size": 5})  # waiting
    resumed = small_tuner(tuner_type, study=record())
    rest = [c.name for c in drive(resumed, landscape)]
    assert [r.name for r in log] + rest == whole and resumed.finished
    trials = record().trials
    orphans = [t for t in trials if "name" not in t.user_attrs]
    assert [t.state for t in orphans] == [TrialState.FAIL, TrialState.FAIL]
    assert orphans[1].user_attrs["abandoned"]  # the queued one (a running one keeps none)
    named = [t for t in trials if "name" in t.user_attrs]
    assert [t.user_attrs["name"] for t in named] == whole
    assert all(t.state.is_finished() for t in named)


def test_a_result_recorded_but_not_told_before_the_kill_is_told_not_run_again(
    tuner_type: str,
) -> None:
    # A result is written as its trial's attributes, then told, in separate writes: a kill -9
    # between them leaves a running trial holding the whole result. That experiment ran.
    landscape = Landscape()
    whole = [c.name for c in drive(small_tuner(tuner_type), landscape)]
    record = stored_study()
    first = small_tuner(tuner_type, study=record())
    log = run_some(first, landscape, 2)
    candidate = first.ask()
    assert candidate is not None
    result = landscape.run(candidate)
    live, _ = first._open[candidate.name]  # the trial as finish() holds it
    for key, value in result_attrs(result).items():
        live.set_user_attr(key, value)
    live.set_user_attr(DS_CONFIG_ATTR, candidate.ds_config)  # the kill comes here
    resumed = small_tuner(tuner_type, study=record())
    rest = [c.name for c in drive(resumed, landscape)]
    assert [r.name for r in log] + [result.name] + rest == whole
    told = record().trials[live.number]
    assert told.state is state_of(result) and told.user_attrs["name"] == result.name
    recorded = [t.user_attrs["name"] for t in record().trials if "status" in t.user_attrs]
    assert recorded == whole  # one record each: none run twice, none lost
