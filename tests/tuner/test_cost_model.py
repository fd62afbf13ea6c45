"""The cost model: its fit recovers the constants that made synthetic step times, and its
uncertainty is the model's own, not a fixed guess."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest

from autotune.tuner.cost_model import (
    NAMES,
    CostModel,
    ModelShape,
    Observation,
    StepShape,
    Topology,
    expected_improvement,
    fit,
    prior_for,
    step_counts,
)
from autotune.tuner.hardware import CATALOG

MODEL = ModelShape(num_params=1_300_000_000, flops_per_sample=6 * 1.3e9 * 1024)
TOPOLOGY = Topology(world_size=8, ranks_per_node=8, precision="bf16")
# What the fit can see from step times on one node without offloading: the compute rate,
# the node's bandwidth, and (less sharply: a third of a sample as calibrated, it shows only
# at the smallest micro-batches) the compute rate's rise with the micro-batch.
IDENTIFIABLE = ("flop_rate", "node_bandwidth")
SEEN = (*IDENTIFIABLE, "half_rate_micro_batch")


def synthetic(true_u: np.ndarray, noise: float, seed: int) -> list[Observation]:
    """Step times of stages 0-3 x micro-batches x overlap made by the model itself with the
    constants ``true_u``, each off by ``noise`` (relative)."""
    rng = random.Random(seed)
    observations = []
    for stage in range(4):
        for micro in (1, 2, 4, 8, 16):
            for overlap in (True, False):
                shape = StepShape(stage, micro, overlap_comm=overlap, reduce_bucket_size=5e8)
                row = step_counts(MODEL, shape, TOPOLOGY)
                exact = (
                    CostModel(
                        u=tuple(true_u),
                        covariance=((0.0,) * len(NAMES),) * len(NAMES),
                        noise=0.0,
                        misfit_measured=0.0,
                        misfit_unmeasured=0.0,
                        prior=prior_for(CATALOG["a100-80gb"], TOPOLOGY),
                    )
                    .predict([row], [f"z{stage}"])[0]
                    .latency_s
                )
                observations.append(
                    Observation(
                        tuple(row),
                        exact * math.exp(rng.gauss(0, noise)),
                        config=f"z{stage}_{micro}_{overlap}",
                        variant=f"z{stage}",
                    )
                )
    return observations


@pytest.mark.parametrize("seed", range(3))
def test_the_fit_recovers_the_constants_step_times_can_tell(seed: int) -> None:
    prior = prior_for(CATALOG["a100-80gb"], TOPOLOGY)
    rng = random.Random(seed)
    # The machine is not its datasheet: every constant off by up to a factor of e^0.7 = 2.
    true_u = np.array(prior.mean) + np.array([rng.uniform(-0.7, 0.7) for _ in prior.mean])
    model = fit(synthetic(true_u, noise=0.01, seed=seed), prior)
    truth = {name: math.exp(u) for name, u in zip(NAMES, true_u, strict=True)}
    for name in IDENTIFIABLE:
        assert model.constants[name] == pytest.approx(truth[name], rel=0.25), name
    for name in SEEN:
        # Its stated uncertainty covers the error.
        error = abs(math.log(model.constants[name] / truth[name]))
        assert error <= 3 * model.relative_sd()[name] + 0.05, name
    # Compute dominates these steps: its rate is pinned; the micro-batch of half that rate
    # (a third of a sample, as calibrated) shows only in the smallest, so it is less so.
    assert model.relative_sd()["flop_rate"] < prior.sd[NAMES.index("flop_rate")] / 2
    name = "half_rate_micro_batch"
    assert model.relative_sd()[name] < prior.sd[NAMES.index(name)]


def test_without_measurements_the_prior_is_the_model_and_its_uncertainty_is_wide() -> None:
    prior = prior_for(CATALOG["v100-32gb"], Topology(16, 16, "fp16"))
    model = fit([], prior)
    assert model.u == prior.mean and model.num_observations == 0
    row = step_counts(MODEL, StepShape(1, 4), Topology(16, 16, "fp16"))
    (before,) = model.predict([row], ["z1"])
    true_u = np.array(prior.mean) + 0.3
    after = fit(synthetic(true_u, 0.01, 0), prior)
    (measured,) = after.predict([row], ["z1"])
    assert measured.sd < before.sd / 3  # measuring near it taught the model


def test_a_configuration_noise_explains_its_misfit_no_further() -> None:
    prior = prior_for(CATALOG["a100-80gb"], TOPOLOGY)
    quiet = fit(synthetic(np.array(prior.mean), 0.0, 0), prior)
    noisy = fit(synthetic(np.array(prior.mean), 0.05, 0), prior)
    assert quiet.misfit_measured < 0.02 and noisy.misfit_measured >= quiet.misfit_measured


def test_expected_improvement_grows_with_the_mean_and_with_the_doubt() -> None:
    assert expected_improvement(math.log(1.1), 1e-9, 0.0) == pytest.approx(0.1)
    assert expected_improvement(math.log(0.9), 1e-9, 0.0) == 0.0
    assert expected_improvement(0.0, 0.1, 0.0) > expected_improvement(0.0, 0.01, 0.0) > 0


def test_the_fitted_model_survives_json() -> None:
    prior = prior_for(CATALOG["h100-80gb"], TOPOLOGY)
    model = fit(synthetic(np.array(prior.mean) - 0.2, 0.01, 1), prior)
    again = CostModel.from_dict(model.to_dict())
    assert again == model
    assert set(model.to_dict()["constants"]) == set(NAMES)
