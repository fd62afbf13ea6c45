"""What published multi-GPU runs achieved of their GPUs' datasheets: the cost model's prior.

A datasheet gives peaks; a run achieves a share of them, and pays host and latency costs no
datasheet lists. :func:`calibrate` fits those shares and costs to published tables (each row
a configuration's counts and its measured step time) with the cost model's own formula:
every constant is a multiple of its datasheet figure (:func:`datasheet_basis`), shared by all
rows, except the compute rate's share, one per GPU and precision class (a V100 with 2021's
software reached a smaller share of its tensor cores than an A100 or H100 with 2023's, and a
larger share of its plain fp32 peak). What the fit cannot explain, the residuals' spread, is
the model's misfit: the doubt a prediction from the datasheet alone carries.

``experiments/calibrate_cost_model.py`` runs the fit on ``experiments/published/`` and
writes :data:`CALIBRATION_PATH`, which :func:`~autotune.tuner.cost_model.prior_for` reads.

Torch-free (NumPy).
"""

from __future__ import annotations

import functools
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from autotune.tuner.cost_terms import CONSTANTS, NAMES, step_seconds
from autotune.tuner.hardware import Hardware

CALIBRATION_PATH = Path(__file__).with_name("calibration.json")
_FLOP = NAMES.index("flop_rate")
_LOGIT = [c.transform == "logit" for c in CONSTANTS]
# Each table weighs as much as any other in the fit, whatever its number of rows, at this
# relative error a row (the prior's guesses weigh against that).
_ROW_ERROR = 0.2


# Each constant as a multiple of a datasheet figure (rates) or in its own unit (the rest):
# the figure, then the guess before calibration and how wide it is (log units). The guesses
# are what a run typically achieves of the peaks; the calibration replaces them.
_WIDE = math.log(10.0)


def datasheet_basis(hardware: Hardware, precision: str) -> dict[str, float]:
    """The datasheet figure each constant is a multiple of (1 for those in their own unit;
    times per parameter are per byte of memory traffic, or per parameter a host updates).

    Example:
        >>> from autotune.tuner.hardware import CATALOG
        >>> datasheet_basis(CATALOG["a100-80gb"], "bf16")["flop_rate"]
        312000000000000.0
    """
    return {
        "flop_rate": hardware.flops(precision),
        "half_rate_micro_batch": 1.0,
        "node_bandwidth": hardware.intra_node_bandwidth,
        "network_bandwidth": hardware.inter_node_bandwidth,
        "hidden_fraction": 1.0,
        "collective_latency": 1.0,
        "copy_bandwidth": hardware.memory_bandwidth,
        "update_time_per_param": 1.0 / hardware.memory_bandwidth,
        "host_update_time_per_param": 1.0 / hardware.host_update_rate,
        "host_bandwidth": hardware.host_bandwidth,
        "micro_step_overhead": 1.0,
        "hook_time_per_tensor": 1.0,
        "fetch_time_per_module": 1.0,
        "step_overhead": 1.0,
    }


def uncalibrated_guess(cpu: bool) -> dict[str, tuple[float, float]]:
    """Each constant's guess as a multiple of its :func:`datasheet_basis`, and its width."""
    return {
        "flop_rate": (1 / 3, math.log(4.0 if cpu else 3.0)),
        "half_rate_micro_batch": (0.5 if cpu else 1.0, math.log(4.0)),
        "node_bandwidth": (0.8, math.log(3.0)),
        "network_bandwidth": (0.8, math.log(3.0)),
        "hidden_fraction": (0.5, 1.5),
        "collective_latency": (5e-5 if cpu else 2e-5, math.log(5.0)),
        "copy_bandwidth": (0.5, math.log(3.0)),
        # Adam reads and writes about 28 bytes a parameter (parameter, gradient, two states,
        # fp32 master under mixed precision) when fused; an optimizer stepping tensor by
        # tensor, with its casts and overflow checks, several times that.
        "update_time_per_param": (28.0, _WIDE),
        "host_update_time_per_param": (1.0, math.log(3.0)),
        "host_bandwidth": (0.7, math.log(3.0)),
        "micro_step_overhead": (2e-3 if cpu else 1e-3, _WIDE),
        # A Python hook's bookkeeping: tens of microseconds.
        "hook_time_per_tensor": (5e-5, _WIDE),
        # Hooks, the fetch order, parameters released: a tenth of a millisecond a module.
        "fetch_time_per_module": (1e-4, _WIDE),
        "step_overhead": (5e-3 if cpu else 3e-3, _WIDE),
    }


@dataclass(frozen=True)
class CalibrationRow:
    """One published measurement: a configuration's counts (a row of
    :data:`~autotune.tuner.step_counts.COLUMNS`) on ``hardware`` at ``precision`` and its
    step time, from ``table``."""

    table: str
    hardware: Hardware
    precision: str
    counts: tuple[float, ...]
    latency_s: float


@dataclass(frozen=True)
class CalibratedRatios:
    """Each constant as a multiple of its datasheet figure, for one GPU, and the relative
    misfit of a prediction made with them."""

    ratios: Mapping[str, float]
    misfit: float


def _theta_to_u(theta: np.ndarray, basis: Mapping[str, float], flop: float) -> np.ndarray:
    """Transformed constants of one GPU: the shared shares (``theta``) with its own compute
    share (``flop``), times its datasheet figures."""
    u = np.empty(len(NAMES))
    for i, name in enumerate(NAMES):
        share = flop if i == _FLOP else theta[i]
        u[i] = share if _LOGIT[i] else math.log(basis[name]) + share
    return u


def _share(value: float, logit: bool) -> float:
    return math.log(value / (1 - value)) if logit else math.log(value)


def calibrate(rows: Sequence[CalibrationRow], max_iterations: int = 100) -> dict[str, Any]:
    """The shares and costs that best explain ``rows`` (maximum a posteriori on the log of
    the step time, the uncalibrated guesses as the prior), and the misfit left.

    Returns:
        JSON-ready: ``ratios`` (each constant over its datasheet figure; ``flop_rate`` the
        mean over GPUs), ``flop_rate`` (the share per GPU), ``misfit`` (the residuals' root
        mean square, relative), ``residuals`` (per table: each row's log of predicted over
        measured), ``rows`` (per table).
    """
    gpus = sorted({_share_key(row.hardware.name, row.precision) for row in rows})
    by_gpu = {
        key: [r for r in rows if _share_key(r.hardware.name, r.precision) == key] for key in gpus
    }
    sizes: dict[str, int] = {}
    for row in rows:
        sizes[row.table] = sizes.get(row.table, 0) + 1
    guesses = uncalibrated_guess(cpu=False)
    prior_mean = [_share(guesses[n][0], _LOGIT[i]) for i, n in enumerate(NAMES)]
    prior_sd = [guesses[n][1] for n in NAMES]
    mean0 = np.array(prior_mean + [prior_mean[_FLOP]] * len(gpus))
    sd0 = np.array(prior_sd + [prior_sd[_FLOP]] * len(gpus))
    groups = []
    for index, key in enumerate(gpus):
        chosen = by_gpu[key]
        groups.append(
            (
                index,
                datasheet_basis(chosen[0].hardware, chosen[0].precision),
                np.array([r.counts for r in chosen], dtype=float),
                np.log(np.array([r.latency_s for r in chosen])),
                np.array([1.0 / (_ROW_ERROR * math.sqrt(sizes[r.table])) for r in chosen]),
                chosen,
            )
        )
    shared = len(NAMES)

    def predicted(theta: np.ndarray) -> list[np.ndarray]:
        return [
            np.log(step_seconds(_theta_to_u(theta, basis, theta[shared + index]), counts))
            for index, basis, counts, _, _, _ in groups
        ]

    def residuals(theta: np.ndarray) -> np.ndarray:
        parts = [
            (logs - target) * weight
            for logs, (_, _, _, target, weight, _) in zip(predicted(theta), groups, strict=True)
        ]
        return np.concatenate([*parts, (theta - mean0) / sd0])

    def jacobian(theta: np.ndarray) -> np.ndarray:
        step = 1e-5
        columns = []
        for i in range(len(theta)):
            up, down = theta.copy(), theta.copy()
            up[i] += step
            down[i] -= step
            columns.append((residuals(up) - residuals(down)) / (2 * step))
        return np.stack(columns, axis=1)

    theta = mean0.copy()
    res = residuals(theta)
    cost, damping = float(res @ res), 1e-3
    for _ in range(max_iterations):
        jac = jacobian(theta)
        gram, gradient = jac.T @ jac, jac.T @ res
        improved = False
        while damping < 1e10:
            trial = theta + np.linalg.solve(gram + damping * np.diag(np.diag(gram)), -gradient)
            trial_res = residuals(trial)
            trial_cost = float(trial_res @ trial_res)
            if trial_cost < cost:
                improved = cost - trial_cost > 1e-10 * cost
                theta, res, cost, damping = trial, trial_res, trial_cost, max(damping / 3, 1e-9)
                break
            damping *= 4
        if not improved:
            break
    by_table: dict[str, list[float]] = {}
    for logs, (_, _, _, target, _, chosen) in zip(predicted(theta), groups, strict=True):
        for row, r in zip(chosen, logs - target, strict=True):
            by_table.setdefault(row.table, []).append(float(r))
    every = [r for values in by_table.values() for r in values]
    # Degrees of freedom: the rows less the constants they pin down.
    dof = max(1, len(every) - len(theta))
    misfit = math.sqrt(sum(r * r for r in every) / dof)
    values = {
        name: (1 / (1 + math.exp(-theta[i])) if _LOGIT[i] else math.exp(theta[i]))
        for i, name in enumerate(NAMES)
    }
    flop = {name: math.exp(theta[shared + i]) for i, name in enumerate(gpus)}
    values["flop_rate"] = math.exp(sum(math.log(v) for v in flop.values()) / len(flop))
    return {
        "ratios": values,
        "flop_rate": flop,
        "misfit": misfit,
        "residuals": by_table,
        "rows": {table: count for table, count in sorted(sizes.items())},
    }


def _share_key(hardware_name: str, precision: str) -> str:
    """The compute share is one per GPU and precision class: a tensor core's half-precision
    peak is harder to reach than the plain fp32 one (a V100 ran DistilBERT in fp32 at a far
    larger share of 15.7 TFLOP/s than GPT2 in fp16 of 125)."""
    return f"{hardware_name}/{'fp32' if precision == 'fp32' else 'half'}"


@functools.cache
def _calibration() -> dict[str, Any] | None:
    try:
        data: dict[str, Any] = json.loads(CALIBRATION_PATH.read_text())
    except FileNotFoundError:
        return None
    return data


def calibrated_ratios(hardware_name: str, precision: str = "bf16") -> CalibratedRatios | None:
    """The calibrated shares for a GPU at a precision (None: no calibration installed). One
    no published table measured gets the mean compute share of those that were at that
    precision class (of all, if none), and a misfit widened by how far their shares lie
    apart.

    Example:
        >>> ratios = calibrated_ratios("h200-141gb")  # no published table: the mean share
        >>> ratios is not None and ratios.misfit > calibrated_ratios("h100-80gb").misfit
        True
    """
    data = _calibration()
    if data is None:
        return None
    ratios = {name: float(data["ratios"][name]) for name in NAMES}
    misfit = float(data["misfit"])
    shares: dict[str, float] = data["flop_rate"]
    key = _share_key(hardware_name, precision)
    if key in shares:
        ratios["flop_rate"] = float(shares[key])
    else:
        klass = key.split("/")[1]
        alike = {k: v for k, v in shares.items() if k.endswith("/" + klass)} or shares
        logs = [math.log(float(v)) for v in alike.values()]
        mean = sum(logs) / len(logs)
        spread = math.sqrt(sum((x - mean) ** 2 for x in logs) / max(1, len(logs) - 1))
        misfit = math.sqrt(misfit**2 + spread**2)
    return CalibratedRatios(ratios, misfit)
