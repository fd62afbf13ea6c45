"""Every tuner is an Optuna sampler of the run's study: the search's proposals are trials the
study's sampler sampled, re-measurements trials queued with fixed parameters; and any Optuna
sampler the user passes searches in its place, its unrunnable suggestions told FAIL, unrun."""

from __future__ import annotations

import optuna
import pytest
from optuna.trial import TrialState

from autotune.tuner.samplers import StudySampler
from autotune.tuner.trials import NOT_RUN_ATTR
from tests.tuner.landscape import Landscape, drive
from tests.tuner.tuners import TUNERS, small_tuner


@pytest.mark.parametrize("tuner_type", TUNERS)
def test_the_search_is_the_studys_sampler_and_every_experiment_its_trial(
    tuner_type: str,
) -> None:
    tuner = small_tuner(tuner_type, num_remeasure=2)
    asked = drive(tuner, Landscape(noise=0.1))
    study = tuner.study
    assert isinstance(study.sampler, StudySampler) and isinstance(
        study.sampler, optuna.samplers.BaseSampler
    )
    trials = study.trials
    assert [t.user_attrs["name"] for t in trials] == [c.name for c in asked]
    for candidate, trial in zip(asked, trials, strict=True):
        fixed = "fixed_params" in trial.system_attrs
        # The search's proposals were sampled by the search; a re-measurement's parameters
        # were fixed, those of the configuration it measures again.
        assert fixed == (candidate.repeat_of is not None), candidate.name
        assert trial.params["zero_stage"] == candidate.stage
        assert trial.params["micro_batch_size"] == candidate.micro_batch_size
        assert trial.state in (TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL)
    repeats = [c for c in asked if c.repeat_of is not None]
    assert repeats, "the noisy landscape re-measures"
    by_name = {t.user_attrs["name"]: t for t in trials}
    for repeat in repeats:
        assert by_name[repeat.name].params == by_name[repeat.repeat_of].params


def test_a_users_optuna_sampler_searches_and_its_duplicates_are_told_fail_unrun() -> None:
    landscape = Landscape(noise=0.02)
    tuner = small_tuner(
        "model_based",
        sampler=optuna.samplers.TPESampler(seed=0, n_startup_trials=4),
        tuner_num_trials=12,
        tuner_early_stopping=6,
    )
    asked = drive(tuner, landscape)
    summary = tuner.summary()
    assert summary.best is not None and 0 < len(asked) <= 12
    assert {c.phase.value for c in asked} <= {"sampler", "remeasure"}
    assert len({c.name for c in asked}) == len(asked)  # nothing measured twice by accident
    study = tuner.study
    assert isinstance(study.sampler, optuna.samplers.TPESampler)
    ran = [t for t in study.trials if "status" in t.user_attrs]
    assert [t.user_attrs["name"] for t in ran] == [c.name for c in asked]
    skipped = [t for t in study.trials if NOT_RUN_ATTR in t.user_attrs]
    assert all(t.state is TrialState.FAIL and "status" not in t.user_attrs for t in skipped)
    # The stages the small space searches (1, 2), with knobs suggested where they are tuned.
    assert {t.params["zero_stage"] for t in ran} <= {1, 2}
    assert any("zero_optimization.reduce_bucket_size" in t.params for t in ran)


def test_a_users_sampler_resumes_on_its_study() -> None:
    from tests.tuner.tuners import stored_study

    landscape = Landscape(noise=0.02)
    record = stored_study()
    first = small_tuner(
        "model_based",
        study=record(),
        sampler=optuna.samplers.RandomSampler(seed=1),
        tuner_num_trials=6,
    )
    done = [c.name for c in drive(first, landscape)]
    resumed = small_tuner(
        "model_based",
        study=record(),
        sampler=optuna.samplers.RandomSampler(seed=1),
        tuner_num_trials=8,
    )
    more = [c.name for c in drive(resumed, landscape)]
    assert resumed.num_replayed == len(done) and not set(done) & set(more)
    assert resumed.summary().num_run == len(done) + len(more)
