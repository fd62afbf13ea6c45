"""Predict, then measure: a model of one optimizer step's time, fitted to what the run measured.

The step's time is the counts :mod:`autotune.tuner.step_counts` makes of a configuration
(FLOPs, bytes, calls, hooks, module fetches) times rates of the machine:

- compute: ``F·(b + b½) / R`` a micro-step, an achieved rate ``b/(b + b½)·R`` that rises with
  the micro-batch ``b`` to a ceiling ``R``;
- communication: ``bytes / bandwidth + calls · latency``; where it overlaps compute (a
  reduction with ``overlap_comm``, stage 3's prefetched gathers) the two run side by side and
  a share ``h`` of the shorter hides under the longer: ``C + M - h·min(C, M)``;
- host work: a cost per gradient hook (stages 2-3, per parameter tensor and micro-step) and
  per module fetch (stage 3, per module, pass and micro-step), which no overlap hides: the
  next kernel waits on the host;
- copies, the optimizer's update (on the device, or on the host when offloaded), and fixed
  costs per micro-step and per step.

Its constants (:data:`CONSTANTS`) start at the datasheet's figures times what published runs
achieved of them (:func:`prior_for`; :mod:`autotune.tuner.calibration`, fitted to DeepSpeed's
and MosaicML's published tables) and are **fitted** to the step times the run measured
(:func:`fit`): a maximum a posteriori fit on the log of the step time, each constant's log
with a Gaussian prior (an order of magnitude wide where a datasheet says little), and its
uncertainty from the curvature (Laplace). A prediction carries the uncertainty of the
constants, the measurement noise, and the model's own misfit: before anything ran, how far
the calibrated model landed from the published tables; after, the share of the measured
times the model could not explain, larger for a ZeRO variant nothing of has run. Memory is
the estimate of :mod:`autotune.tuner.memory`.

Torch-free (NumPy): the tuner refits after every result.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from autotune.tuner.cost_prior import (
    PRIOR_MISFIT_MEASURED,
    PRIOR_MISFIT_UNMEASURED,
    PRIOR_MISFIT_WEIGHT,
    Prior,
    prior_for,
)
from autotune.tuner.cost_terms import CONSTANTS, NAMES, step_seconds, transformed_values
from autotune.tuner.step_counts import (
    COLUMNS,
    ModelShape,
    StepShape,
    Topology,
    step_counts,
)

__all__ = [
    "COLUMNS",
    "CONSTANTS",
    "NAMES",
    "CostModel",
    "ModelShape",
    "Observation",
    "Prediction",
    "Prior",
    "StepShape",
    "Topology",
    "expected_improvement",
    "fit",
    "log_throughput",
    "measurement_noise",
    "normal_cdf",
    "prior_for",
    "step_counts",
    "step_seconds",
]


# Relative run-to-run noise of one measurement before repeats say otherwise, and how many
# degrees of freedom that guess weighs (the committed CPU tables: 2-3%; GPUs: 1-2%).
PRIOR_NOISE = 0.03
PRIOR_NOISE_WEIGHT = 4.0


@dataclass(frozen=True)
class Observation:
    """One measured step time (``latency_s``: seconds per optimizer step, the window's mean)
    of a configuration (its row of counts), with how much to trust it (``noise_scale``: 1 for
    a quiet measurement, larger for one taken while the machine was busy)."""

    counts: tuple[float, ...]
    latency_s: float
    config: str = ""
    variant: str = ""
    noise_scale: float = 1.0


@dataclass(frozen=True)
class Prediction:
    """A predicted step time: the log of seconds per step and its variance (constants,
    misfit; ``noise_var`` adds what one measurement of it would vary by)."""

    log_latency: float
    variance: float
    noise_var: float

    @property
    def latency_s(self) -> float:
        return math.exp(self.log_latency)

    @property
    def sd(self) -> float:
        """Relative standard deviation of the prediction (constants and misfit)."""
        return math.sqrt(self.variance)


@dataclass(frozen=True)
class CostModel:
    """The constants after a fit, and what predicting with them needs.

    Attributes:
        u: each constant's transformed value (log, or log-odds for fractions).
        covariance: their posterior covariance (Laplace).
        noise: relative noise of one measurement.
        misfit_measured: relative misfit of predictions for a ZeRO variant that has run.
        misfit_unmeasured: the same for a variant nothing of has run.
        prior: where the fit started.
        num_observations: measurements it was fitted to.
        measured_variants: the variants it saw.
    """

    u: tuple[float, ...]
    covariance: tuple[tuple[float, ...], ...]
    noise: float
    misfit_measured: float
    misfit_unmeasured: float
    prior: Prior
    num_observations: int = 0
    measured_variants: frozenset[str] = field(default_factory=frozenset)

    @classmethod
    def from_prior(cls, prior: Prior) -> CostModel:
        """The model before anything ran: the prior itself. A calibrated prior's doubt is how
        far its predictions landed from the published tables (its misfit); an uncalibrated
        one's, the width of each guess."""
        spread = () if prior.calibrated else prior.sd
        return cls(
            u=prior.mean,
            covariance=tuple(
                tuple(sd * sd if i == j and spread else 0.0 for j in range(len(prior.sd)))
                for i, sd in enumerate(prior.sd)
            ),
            noise=PRIOR_NOISE,
            misfit_measured=prior.misfit,
            misfit_unmeasured=prior.misfit,
            prior=prior,
        )

    @property
    def constants(self) -> dict[str, float]:
        """Each constant's fitted value, in its unit."""
        return dict(zip(NAMES, transformed_values(np.array(self.u)).tolist(), strict=True))

    def relative_sd(self) -> dict[str, float]:
        """Each constant's uncertainty: the standard deviation of its log (about its relative
        standard deviation; of its log-odds for a fraction)."""
        return {n: math.sqrt(max(0.0, self.covariance[i][i])) for i, n in enumerate(NAMES)}

    def gradients(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The log of each row's predicted step time, and its gradient with respect to the
        transformed constants (rows × constants): how two predictions' errors go together
        is ``g1 @ covariance @ g2``."""
        u = np.array(self.u)
        seconds = step_seconds(u, rows)
        return np.log(seconds), _log_jacobian(u, rows, seconds)

    def predict(self, rows: Sequence[Sequence[float]], variants: Sequence[str]) -> list[Prediction]:
        """The predicted step time of each row of counts (of a configuration of ``variants``)."""
        if not rows:
            return []
        matrix = np.asarray(rows, dtype=float)
        u = np.array(self.u)
        mean = step_seconds(u, matrix)
        jac = _log_jacobian(u, matrix, mean)
        cov = np.array(self.covariance)
        var = np.einsum("ij,jk,ik->i", jac, cov, jac)
        predictions = []
        for i, variant in enumerate(variants):
            misfit = (
                self.misfit_measured
                if variant in self.measured_variants
                else self.misfit_unmeasured
            )
            predictions.append(
                Prediction(math.log(mean[i]), float(var[i]) + misfit**2, self.noise**2)
            )
        return predictions

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: the constants with their units and uncertainties, and what
        ``autotune plan --from`` needs to predict with them."""
        sd = self.relative_sd()
        return {
            "constants": {
                c.name: {
                    "value": value,
                    "unit": c.unit,
                    "log_sd": sd[c.name],
                    "prior": float(transformed_values(np.array(self.prior.mean))[i]),
                    "description": c.description,
                }
                for i, (c, value) in enumerate(zip(CONSTANTS, self.constants.values(), strict=True))
            },
            "noise": self.noise,
            "misfit_measured": self.misfit_measured,
            "misfit_unmeasured": self.misfit_unmeasured,
            "num_observations": self.num_observations,
            "measured_variants": sorted(self.measured_variants),
            "u": list(self.u),
            "covariance": [list(row) for row in self.covariance],
            "prior": self.prior.to_dict(),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> CostModel:
        """The model :meth:`to_dict` wrote.

        Raises:
            ValueError: it was fitted with other constants (an earlier version of the model).
        """
        prior = data["prior"]
        if len(data["u"]) != len(NAMES) or len(prior["mean"]) != len(NAMES):
            raise ValueError(
                f"fitted with {len(data['u'])} constants; this cost model has {len(NAMES)} "
                "(an earlier version fitted it)"
            )
        return cls(
            u=tuple(float(x) for x in data["u"]),
            covariance=tuple(tuple(float(x) for x in row) for row in data["covariance"]),
            noise=float(data["noise"]),
            misfit_measured=float(data["misfit_measured"]),
            misfit_unmeasured=float(data["misfit_unmeasured"]),
            prior=Prior(
                tuple(prior["mean"]),
                tuple(prior["sd"]),
                prior.get("hardware", ""),
                float(prior.get("misfit", PRIOR_MISFIT_UNMEASURED)),
                bool(prior.get("calibrated", False)),
            ),
            num_observations=int(data.get("num_observations", 0)),
            measured_variants=frozenset(data.get("measured_variants", ())),
        )

    def with_prior_for(self, names: Iterable[str], prior: Prior) -> CostModel:
        """This model with the constants ``names`` reset to ``prior`` (what a run could not
        have measured, e.g. the network for a run on one node)."""
        u, cov = list(self.u), [list(row) for row in self.covariance]
        for name in names:
            i = NAMES.index(name)
            u[i] = prior.mean[i]
            for j in range(len(u)):
                cov[i][j] = cov[j][i] = 0.0
            cov[i][i] = prior.sd[i] ** 2
        return replace(self, u=tuple(u), covariance=tuple(tuple(r) for r in cov))


def _log_jacobian(u: np.ndarray, rows: np.ndarray, seconds: np.ndarray) -> np.ndarray:
    """d log(step time) / d u for every row (central differences): one column per constant."""
    step = 1e-4
    shifted = np.repeat(u[None, :], 2 * len(u), axis=0)
    for i in range(len(u)):
        shifted[2 * i, i] += step
        shifted[2 * i + 1, i] -= step
    times = step_seconds(shifted, rows)  # (2k, rows)
    logs = np.log(np.maximum(times, 1e-300))
    return ((logs[0::2] - logs[1::2]) / (2 * step)).T


def measurement_noise(groups: Iterable[Sequence[float]]) -> float:
    """Relative noise of one measurement: the pooled standard deviation of the log of each
    configuration's repeated step times, shrunk towards :data:`PRIOR_NOISE`.

    Example:
        >>> round(measurement_noise([[1.0, 1.0], [2.0]]), 4)  # little evidence: near the prior
        0.0268
    """
    squares, degrees = PRIOR_NOISE_WEIGHT * PRIOR_NOISE**2, PRIOR_NOISE_WEIGHT
    for values in groups:
        logs = [math.log(v) for v in values if v > 0]
        if len(logs) < 2:
            continue
        mean = sum(logs) / len(logs)
        squares += sum((x - mean) ** 2 for x in logs)
        degrees += len(logs) - 1
    return math.sqrt(squares / degrees)


def fit(observations: Sequence[Observation], prior: Prior, max_iterations: int = 60) -> CostModel:
    """The constants that best explain ``observations`` given ``prior`` (maximum a
    posteriori on the log of the step time), with their uncertainty.

    Levenberg-Marquardt on the transformed constants; the covariance is the inverse of the
    posterior's curvature at the optimum (Laplace). The noise is pooled from configurations
    measured more than once (:func:`measurement_noise`); the misfit from what the residuals
    leave unexplained beyond that noise.
    """
    if not observations:
        return CostModel.from_prior(prior)
    by_config: dict[str, list[float]] = {}
    for obs in observations:
        by_config.setdefault(obs.config or repr(obs.counts), []).append(obs.latency_s)
    noise = measurement_noise(by_config.values())
    rows = np.array([obs.counts for obs in observations], dtype=float)
    target = np.log(np.array([obs.latency_s for obs in observations]))
    weights = 1.0 / (noise * np.array([obs.noise_scale for obs in observations]))
    mean0, sd0 = np.array(prior.mean), np.array(prior.sd)

    def residuals(u: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        seconds = step_seconds(u, rows)
        data = (np.log(seconds) - target) * weights
        return np.concatenate([data, (u - mean0) / sd0]), seconds

    u = mean0.copy()
    res, seconds = residuals(u)
    cost, damping = float(res @ res), 1e-3
    for _ in range(max_iterations):
        jac = np.vstack([_log_jacobian(u, rows, seconds) * weights[:, None], np.diag(1 / sd0)])
        gram = jac.T @ jac
        gradient = jac.T @ res
        improved = False
        while damping < 1e10:
            step = np.linalg.solve(gram + damping * np.diag(np.diag(gram)), -gradient)
            trial = u + step
            trial_res, trial_seconds = residuals(trial)
            trial_cost = float(trial_res @ trial_res)
            if trial_cost < cost:
                u, res, seconds = trial, trial_res, trial_seconds
                improved, damping = cost - trial_cost > 1e-10 * cost, max(damping / 3, 1e-9)
                cost = trial_cost
                break
            damping *= 4
        if not improved:
            break
    jac = np.vstack([_log_jacobian(u, rows, seconds) * weights[:, None], np.diag(1 / sd0)])
    covariance = np.linalg.inv(jac.T @ jac)
    # The misfit: per configuration, the mean residual beyond what its measurements' noise
    # explains, pooled with a prior guess.
    log_residual = np.log(seconds) - target
    excess: dict[str, list[float]] = {}
    variants: set[str] = set()
    for obs, r in zip(observations, log_residual, strict=True):
        excess.setdefault(obs.config or repr(obs.counts), []).append(float(r))
        if obs.variant:
            variants.add(obs.variant)
    unexplained = sum(
        max(0.0, (sum(rs) / len(rs)) ** 2 - noise**2 / len(rs)) for rs in excess.values()
    )
    misfit = math.sqrt(
        (PRIOR_MISFIT_WEIGHT * PRIOR_MISFIT_MEASURED**2 + unexplained)
        / (PRIOR_MISFIT_WEIGHT + len(excess))
    )
    return CostModel(
        u=tuple(float(x) for x in u),
        covariance=tuple(tuple(float(x) for x in row) for row in covariance),
        noise=noise,
        misfit_measured=misfit,
        misfit_unmeasured=max(misfit, PRIOR_MISFIT_UNMEASURED),
        prior=prior,
        num_observations=len(observations),
        measured_variants=frozenset(variants),
    )


def log_throughput(prediction: Prediction, samples_per_step: int) -> tuple[float, float]:
    """Mean and standard deviation of the log of global samples per second predicted."""
    return math.log(samples_per_step) - prediction.log_latency, prediction.sd


def expected_improvement(mean: float, sd: float, best: float) -> float:
    """E[max(0, e^Y - e^best)] / e^best for Y ~ N(mean, sd²): the expected gain over the best
    measured, as a share of it (log-normal).

    Example:
        >>> round(expected_improvement(math.log(1.1), 1e-9, 0.0), 6)  # a sure 10% gain
        0.1
    """
    if sd <= 1e-12:
        return max(0.0, math.exp(mean - best) - 1.0)
    var = sd * sd
    up = math.exp(mean - best + var / 2) * _phi((mean + var - best) / sd)
    return max(0.0, up - _phi((mean - best) / sd))


def _phi(x: float) -> float:
    """The standard normal CDF."""
    return 0.5 * math.erfc(-x / math.sqrt(2.0))


normal_cdf = _phi
