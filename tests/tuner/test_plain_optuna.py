"""autotune's samplers in a plain Optuna study, as a user runs them: ``study.ask()`` and
``space.suggest``, and ``study.optimize`` over an objective that replays a measured landscape
(out of memory reported as the docs say): each decides from the study alone, stops it when its
search is over, and never measures a configuration twice, two workers or one."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import optuna
import pytest

from autotune.bench.table import WITHIN, TableRunner, landscape_job, replay
from autotune.experiment import ExperimentSpec
from autotune.profiling.model_info import ModelInfo
from autotune.samplers import GridSampler, ModelBasedSampler, RandomSampler, SearchSpace

ROOT = Path(__file__).resolve().parents[2]
TABLE = json.loads((ROOT / "results" / "landscapes" / "gpt_long_48mib.json").read_text())
SAMPLERS = {"model_based": ModelBasedSampler, "gridsearch": GridSampler, "random": RandomSampler}


def space_of(table: dict[str, Any], tuner_type: str) -> SearchSpace:
    job = landscape_job(table, tuner_type=tuner_type, seed=0)
    return SearchSpace(
        job.config,
        device_memory=job.memory_budget,
        model_info=ModelInfo(**table["model_info"]),
    )


def measure(
    space: SearchSpace, runner: TableRunner, trial: optuna.Trial, params: dict[str, Any]
) -> float | None:
    """Train a few steps with ``params``' config (here: the table's measurement of it);
    its throughput, or None where it failed (its status set on ``trial``, as the docs say)."""
    name, ds_config = space.name(params), space.ds_config(params)
    result = runner.run(ExperimentSpec(name, ds_config, "gpt", {}, 2, 2, 4, 60.0, 0, 1))
    if result.metrics is None:
        trial.set_user_attr("status", result.status.value)
        return None
    trial.set_user_attr("peak_memory_bytes", result.metrics.peak_memory_bytes)
    return result.metrics.throughput


def objective_of(space: SearchSpace, runner: TableRunner) -> Any:
    """A user's objective: out of memory is a pruned trial with status ``oom``."""

    def objective(trial: optuna.Trial) -> float:
        value = measure(space, runner, trial, space.suggest(trial))
        if value is None:
            raise optuna.TrialPruned()
        return value

    return objective


@pytest.mark.parametrize("tuner_type", list(SAMPLERS))
def test_each_sampler_searches_a_plain_study_and_stops_it_when_done(tuner_type: str) -> None:
    space = space_of(TABLE, tuner_type)
    sampler = SAMPLERS[tuner_type](space, seed=0)
    study = optuna.create_study(direction=space.direction, sampler=sampler)
    runner = TableRunner(TABLE, seed=0)
    study.optimize(objective_of(space, runner), n_trials=500)
    names = [space.name(t.params) for t in study.trials]
    assert len(set(names)) == len(names), "a configuration was measured twice"
    assert len(names) < 500 and "search_end" in study.user_attrs  # stopped, saying why
    best = max(runner.value(n) or 0.0 for n in names)
    assert best >= WITHIN * runner.best_value
    # What autotune's own loop proposes first, the plain study was handed first.
    assert names[0] == replay(TABLE, tuner_type, 0).names[0]


@pytest.mark.slow
def test_model_based_reaches_the_best_in_plain_optuna_as_fast_as_autotune_run() -> None:
    for table_path in sorted((ROOT / "results" / "landscapes").glob("*.json")):
        table = json.loads(table_path.read_text())
        space = space_of(table, "model_based")
        study = optuna.create_study(
            direction=space.direction, sampler=ModelBasedSampler(space, seed=0)
        )
        runner = TableRunner(table, seed=0)
        study.optimize(objective_of(space, runner), n_trials=200)
        values = [runner.value(space.name(t.params)) for t in study.trials]
        goal = WITHIN * runner.best_value
        reached = next(i for i, v in enumerate(values, start=1) if v is not None and v >= goal)
        ours = replay(table, "model_based", 0).experiments_to(WITHIN)
        assert ours is not None and reached <= ours, table_path.name


def test_two_workers_never_measure_a_configuration_twice() -> None:
    space = space_of(TABLE, "model_based")
    study = optuna.create_study(
        direction=space.direction, sampler=ModelBasedSampler(space, seed=0, poll_s=0.01)
    )
    study.optimize(objective_of(space, TableRunner(TABLE, seed=0)), n_trials=60, n_jobs=2)
    measured = [space.name(t.params) for t in study.trials if t.params]
    assert measured and len(set(measured)) == len(measured)
    unrun = [t for t in study.trials if not t.params]  # asked after the search was over
    assert all(t.state is optuna.trial.TrialState.PRUNED for t in unrun)


def test_ask_and_tell_by_hand_follow_the_search() -> None:
    space = space_of(TABLE, "gridsearch")
    study = optuna.create_study(direction=space.direction, sampler=GridSampler(space))
    runner = TableRunner(TABLE, seed=0)
    expected = replay(TABLE, "gridsearch", 0).names
    for name in expected[:4]:
        trial = study.ask()
        params = space.suggest(trial)
        assert space.name(params) == name
        value = measure(space, runner, trial, params)
        if value is None:
            study.tell(trial, state=optuna.trial.TrialState.PRUNED)
        else:
            study.tell(trial, value)


def test_ray_tunes_optuna_search_takes_the_sampler_as_it_is(tmp_path: Path) -> None:
    # Tune's loop, as its TuneController drives a searcher: suggest, run the trial, report;
    # the searcher saved and restored between (Tune checkpoints it). The docs' subclass ends
    # the Tune run once the search is over.
    pytest.importorskip("ray.tune")
    from ray.tune.search import Searcher
    from ray.tune.search.optuna import OptunaSearch

    from autotune.samplers import SearchOver

    class AutotuneSearch(OptunaSearch):
        def suggest(self, trial_id: str) -> dict[str, Any] | str | None:
            try:
                return super().suggest(trial_id)
            except SearchOver:
                return Searcher.FINISHED

    space = space_of(TABLE, "model_based")
    runner = TableRunner(TABLE, seed=0)
    search = AutotuneSearch(
        space=space.suggest,
        sampler=ModelBasedSampler(space, seed=0),
        metric="throughput",
        mode="max",
    )
    names = []
    for number in range(100):
        config = search.suggest(str(number))
        if config == Searcher.FINISHED:
            break
        assert isinstance(config, dict)
        names.append(space.name(config))
        value = runner.value(names[-1])
        result = {"throughput": value} if value is not None else None
        search.on_trial_complete(str(number), result, error=value is None)
        if number == 2:  # Tune checkpoints its searcher; a restored one goes on alike
            search.save(str(tmp_path / "searcher.pkl"))
            search.restore(str(tmp_path / "searcher.pkl"))
    assert 0 < len(names) < 100 and len(set(names)) == len(names)
    assert max(runner.value(n) or 0.0 for n in names) >= WITHIN * runner.best_value
