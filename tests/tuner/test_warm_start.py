"""A run started from what an earlier one on the same hardware taught: its fitted constants as
the prior, its answer measured first."""

from __future__ import annotations

import pytest

from autotune.tuner import Candidate
from autotune.tuner.warm_start import WarmStart
from tests.tuner.landscape import Landscape, drive
from tests.tuner.tuners import small_tuner


def first_run() -> tuple[WarmStart, str]:
    tuner = small_tuner("model_based")
    drive(tuner, Landscape(noise=0.02))
    summary, model = tuner.summary(), tuner.cost_model()
    assert summary.best is not None and model is not None
    return WarmStart(model.to_dict(), (dict(summary.best_overrides),)), summary.best.name


def test_the_earlier_answer_is_measured_first_and_the_fitted_constants_are_the_prior() -> None:
    warm, best = first_run()
    tuner = small_tuner("model_based", warm_start=warm)
    first = tuner.ask()
    assert first is not None and first.name == best
    model = tuner.cost_model()
    prior = warm.prior()
    assert model is not None and prior is not None and model.prior == prior
    assert prior.mean == tuple(warm.cost_model["u"])  # type: ignore[index]


def test_a_warm_start_reaches_the_answer_in_fewer_experiments() -> None:
    warm, _ = first_run()
    landscape = Landscape(noise=0.02, seed=1)
    cold_run = drive(small_tuner("model_based"), landscape)
    warm_run = drive(small_tuner("model_based", warm_start=warm), landscape)

    def throughput(candidate: Candidate) -> float:  # noise-free, 0 where it does not fit
        config = candidate.ds_config
        if landscape.peak_bytes(config) > landscape.budget_bytes:
            return 0.0
        return config["train_batch_size"] / landscape.step_time_s(config)

    goal = 0.98 * max(throughput(c) for c in [*cold_run, *warm_run])

    def experiments_to_goal(run: list[Candidate]) -> int:
        return next(i for i, c in enumerate(run, start=1) if throughput(c) >= goal)

    assert experiments_to_goal(warm_run) == 1 < experiments_to_goal(cold_run)


def test_answers_outside_the_space_and_an_old_model_are_passed_over() -> None:
    stale = {"u": [0.0], "covariance": [[1.0]], "prior": {"mean": [0.0]}}
    warm = WarmStart(stale, ({"zero_optimization.stage": 0, "train_micro_batch_size_per_gpu": 8},))
    assert warm.prior() is None  # fitted by another version of the model: the datasheet stands
    tuner = small_tuner("model_based", warm_start=warm)  # stage 0 is not searched
    first = tuner.ask()
    assert first is not None and first.stage in (1, 2)


@pytest.mark.parametrize("tuner_type", ["gridsearch", "random"])
def test_the_baselines_search_as_before(tuner_type: str) -> None:
    warm, _ = first_run()
    landscape = Landscape(noise=0.02)
    plain = [c.name for c in drive(small_tuner(tuner_type), landscape)]
    warmed = [c.name for c in drive(small_tuner(tuner_type, warm_start=warm), landscape)]
    assert warmed == plain
