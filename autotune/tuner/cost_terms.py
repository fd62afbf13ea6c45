"""The cost model's constants and the formula that turns a configuration's counts
(:mod:`autotune.tuner.step_counts`) into seconds with them (see
:mod:`autotune.tuner.cost_model` for what each term is). Shared by the model's fit and by
its calibration on published tables (:mod:`autotune.tuner.calibration`).

Torch-free (NumPy).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from autotune.tuner.step_counts import COLUMN


@dataclass(frozen=True)
class Constant:
    """One constant of the model: its name, unit, and how it is kept positive (``log``: the
    fit works on its logarithm; ``logit``: a fraction, on its log-odds)."""

    name: str
    unit: str
    description: str
    transform: str = "log"


CONSTANTS: tuple[Constant, ...] = (
    Constant("flop_rate", "FLOP/s", "achieved compute rate at a large micro-batch (ceiling)"),
    Constant("half_rate_micro_batch", "samples", "micro-batch at which half that rate is reached"),
    Constant("node_bandwidth", "B/s", "collective bandwidth per rank within a node"),
    Constant("network_bandwidth", "B/s", "collective bandwidth per rank across nodes"),
    Constant(
        "hidden_fraction",
        "",
        "share of the shorter of overlapping compute and comm hidden",
        "logit",
    ),
    Constant("collective_latency", "s", "fixed cost of one collective call"),
    Constant("copy_bandwidth", "B/s", "device memory copies into and out of flat buffers"),
    Constant("update_time_per_param", "s", "optimizer update of one parameter on the device"),
    Constant("host_update_time_per_param", "s", "optimizer update of one parameter offloaded"),
    Constant("host_bandwidth", "B/s", "device-host copies of an offloaded optimizer"),
    Constant("micro_step_overhead", "s", "fixed cost per micro-step"),
    Constant("hook_time_per_tensor", "s", "a gradient hook's host work, per tensor (stages 2-3)"),
    Constant("fetch_time_per_module", "s", "ZeRO-3's host work fetching and releasing a module"),
    Constant("step_overhead", "s", "fixed cost per optimizer step"),
)
NAMES = tuple(c.name for c in CONSTANTS)
_INDEX = {name: i for i, name in enumerate(NAMES)}
_LOGIT = np.array([c.transform == "logit" for c in CONSTANTS])


def transformed_values(u: np.ndarray) -> np.ndarray:
    """Constants from their transformed values (``u``: one row per parameter set)."""
    return np.where(_LOGIT, 1.0 / (1.0 + np.exp(-u)), np.exp(u))


def step_seconds(u: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """Seconds per optimizer step of every row, for each parameter set in ``u`` (one row of
    transformed constants, or several): shape ``(sets, rows)``, or ``(rows,)`` for one set."""
    v = transformed_values(np.atleast_2d(u))
    col = {name: rows[:, i][None, :] for name, i in COLUMN.items()}
    k = {name: v[:, i][:, None] for name, i in _INDEX.items()}
    bandwidth = np.where(col["spans_nodes"] > 0, k["network_bandwidth"], k["node_bandwidth"])
    latency = k["collective_latency"]
    g = np.maximum(col["micro_steps"], 1.0)
    compute = (col["samples_flops"] + col["flops"] * k["half_rate_micro_batch"]) / (
        k["flop_rate"] * g
    )
    micro_comm = (col["micro_overlap_bytes"] / bandwidth + col["micro_overlap_calls"] * latency) / g
    boundary = col["boundary_overlap_bytes"] / bandwidth + col["boundary_overlap_calls"] * latency
    hidden = k["hidden_fraction"]

    def side_by_side(c: np.ndarray, m: np.ndarray) -> np.ndarray:
        return c + m - hidden * np.minimum(c, m)

    seconds = (
        (g - 1.0) * side_by_side(compute, micro_comm)
        + side_by_side(compute, micro_comm + boundary)
        + col["exposed_bytes"] / bandwidth
        + col["exposed_calls"] * latency
        + col["copy_bytes"] / k["copy_bandwidth"]
        + col["update_params"] * k["update_time_per_param"]
        + col["host_params"] * k["host_update_time_per_param"]
        + col["host_bytes"] / k["host_bandwidth"]
        + col["micro_steps"] * k["micro_step_overhead"]
        + col["hooked_tensors"] * k["hook_time_per_tensor"]
        + col["module_fetches"] * k["fetch_time_per_module"]
        + k["step_overhead"]
    )
    return seconds[0] if u.ndim == 1 else seconds
