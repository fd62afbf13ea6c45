"""Where the cost model is wrong near what was measured: a Gaussian process on its residuals.

A configuration's misfit has a part its whole variant shares (what the model leaves out of a
stage's cost), as large as an unmeasured variant's misfit, and a local part, as large as the
misfit the fit showed, which fades with the micro-batches' ratio and with each knob that
differs (:func:`kernel_matrix`, the one place the kernel is written). Conditioned on what was
measured, a configuration next to a measured one is predicted from that measurement, and one
in a variant nothing of has run carries the model's full uncertainty.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from autotune.tuner.cost_model import CostModel
from autotune.tuner.model_search.index import Key, Knobs
from autotune.tuner.space import Variant

# How alike two configurations' misfits are, beyond what their variant shares: micro-batches
# this many e-folds apart keep e^-1/2 of it, each knob that differs keeps this share.
MICRO_BATCH_SCALE = math.log(4.0)
KNOB_CORRELATION = 0.8


def kernel_matrix(
    keys: Sequence[Key], others: Sequence[Key], variant_var: float, local_var: float
) -> np.ndarray:
    """The prior covariance of the misfit at each of ``keys`` with each of ``others``:
    ``variant_var`` shared by a whole variant, ``local_var`` fading with the micro-batches'
    ratio and each knob that differs; none between variants.

    Example:
        >>> from autotune.tuner.space import Variant
        >>> a, b = (Variant(1), 8, ()), (Variant(1), 32, ())
        >>> kernel_matrix([a], [a, b, (Variant(2), 8, ())], 0.01, 0.04).round(4).tolist()
        [[0.05, 0.0343, 0.0]]
    """
    matrix = np.zeros((len(keys), len(others)))
    groups: dict[tuple[Variant, Knobs], list[int]] = {}
    for position, (variant, _, knobs) in enumerate(keys):
        groups.setdefault((variant, knobs), []).append(position)
    log_sizes = np.log(np.array([key[1] for key in keys], dtype=float))
    for (variant, knobs), rows in groups.items():
        for j, (other_variant, other_size, other_knobs) in enumerate(others):
            if other_variant != variant:
                continue
            distance = (log_sizes[rows] - math.log(other_size)) / MICRO_BATCH_SCALE
            local = np.exp(-0.5 * distance**2) * KNOB_CORRELATION ** _differing(knobs, other_knobs)
            matrix[rows, j] = variant_var + local_var * local
    return matrix


def _differing(a: Knobs, b: Knobs) -> int:
    return sum(1 for x, y in zip(a, b, strict=False) if x != y) + abs(len(a) - len(b))


class Residuals:
    """The residual process conditioned on ``measured``: each measured configuration's key,
    its mean residual (log step time against ``model``) and that mean's noise variance."""

    def __init__(self, measured: Sequence[tuple[Key, float, float]], model: CostModel) -> None:
        self._keys = [key for key, _, _ in measured]
        self._variant_var = max(0.0, model.misfit_unmeasured**2 - model.misfit_measured**2)
        self._local_var = model.misfit_measured**2
        self._inverse: np.ndarray = np.zeros((0, 0))
        self._weights: np.ndarray = np.zeros(0)
        if not measured:
            return
        residuals = np.array([r for _, r, _ in measured])
        gram = self._kernel(self._keys, self._keys)
        gram += np.diag([n for _, _, n in measured])
        self._inverse = np.linalg.inv(gram)
        self._weights = self._inverse @ residuals

    def _kernel(self, keys: Sequence[Key], others: Sequence[Key]) -> np.ndarray:
        return kernel_matrix(keys, others, self._variant_var, self._local_var)

    def posterior(self, keys: Sequence[Key]) -> tuple[np.ndarray, np.ndarray]:
        """Each key's residual given what was measured: its mean (the shift of its predicted
        log step time) and its variance."""
        prior_var = np.full(len(keys), self._variant_var + self._local_var)
        if not self._keys:
            return np.zeros(len(keys)), prior_var
        cross = self._kernel(keys, self._keys)
        explained = np.einsum("ij,jk,ik->i", cross, self._inverse, cross)
        return cross @ self._weights, np.maximum(0.0, prior_var - explained)

    def covariance(self, keys: Sequence[Key], other: Key) -> np.ndarray:
        """The posterior covariance of each key's residual with ``other``'s."""
        prior = self._kernel(keys, [other])[:, 0]
        if not self._keys:
            return prior
        cross = self._kernel(keys, self._keys)
        return prior - cross @ self._inverse @ self._kernel([other], self._keys)[0]
