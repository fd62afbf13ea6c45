"""``model_based``: predict every configuration, measure the one most likely to beat the best.

Every configuration of the space (each variant's micro-batch sizes, times its knob points) is
predicted by the cost model (:mod:`autotune.tuner.cost_model`), refitted to everything
measured so far, and by the memory estimate. The next experiment is the configuration with
the largest expected improvement over the best measured, times the chance that it fits in
memory; the search ends when no configuration left could, even optimistically (the upper end
of its prediction's 80% interval), beat the best measured by more than the tolerance.

Where the model is wrong near what was measured, its residuals say so
(:mod:`autotune.tuner.model_search.residuals`). Every cost the model counts falls per sample
as the micro-batch grows, so a configuration measured at a larger micro-batch (same variant
and knobs) bounds the smaller
ones: they can beat it only by noise, and are not measured; except where memory was nearly
full, which can slow a step (the allocator's retries) in ways no count shows.

How likely a configuration is to fit: :mod:`autotune.tuner.model_search.fit_chance`; the
configurations and what the model counts of each: :mod:`autotune.tuner.model_search.index`.
"""

from __future__ import annotations

import math
from collections.abc import Container, Sequence

import numpy as np

from autotune.config import Config, Metric
from autotune.experiment import ExperimentResult
from autotune.tuner.bounds import Bounds
from autotune.tuner.cost_model import (
    CostModel,
    ModelShape,
    Observation,
    Prior,
    Topology,
    expected_improvement,
    fit,
    step_counts,
)
from autotune.tuner.history import Entry, History
from autotune.tuner.model_search.fit_chance import FitChance
from autotune.tuner.model_search.index import (
    Key,
    Knobs,
    SpaceIndex,
    accumulation_steps,
    step_shape,
)
from autotune.tuner.model_search.residuals import Residuals
from autotune.tuner.model_search.scored import (
    MIN_FIT_PROBABILITY,
    FitCache,
    Scored,
    worth_measuring,
)
from autotune.tuner.ranking import Ranked
from autotune.tuner.space import Variant

# The share of device memory under which a step may slow down as the allocator retries.
EDGE_SHARE = 0.05
# A measurement taken while the machine was busy, or cut short as a loser, says less.
DISTURBED_NOISE_SCALE = 3.0
STOPPED_NOISE_SCALE = 1.5


class ModelSearch:
    """The ``model_based`` search over the configurations of ``index`` (see the module
    docstring), on what ``history`` holds.

    Args:
        config: the user's config (precision, world size, batch rules).
        index: the configurations of the space searched now, built once per space
            (:meth:`SpaceIndex.build`).
        history: what the study says of the run.
        bounds: what failures prune.
        topology: the ranks, their nodes, the precision.
        prior: where the constants start.
        model: the workload's size and FLOPs (None: unknown yet).
        fits: fitted cost models, kept across decisions (None: none kept).
        excluded: configurations that may not run (they break a config rule).
        ruled_out: the labels of variants none of whose configurations runs.
    """

    def __init__(
        self,
        config: Config,
        index: SpaceIndex,
        history: History,
        bounds: Bounds,
        topology: Topology,
        prior: Prior,
        model: ModelShape | None,
        fits: FitCache | None = None,
        excluded: Container[str] = (),
        ruled_out: Container[str] = (),
    ) -> None:
        self._config = config
        self._index = index
        self._history = history
        self._bounds = bounds
        self._metric: Metric = config.autotuning.metric
        self.topology = topology
        self.prior = prior
        self._model = model
        self._fits = fits or FitCache()
        self._excluded = excluded
        self._ruled_out = ruled_out
        self._chance = FitChance(history, index)

    def __contains__(self, name: object) -> bool:
        return name in self._index.index

    def key_of(self, name: str) -> Key | None:
        """The variant, micro-batch and knobs ``name`` names (None: not in the space)."""
        index = self._index.index.get(name)
        return None if index is None else self._index.keys[index]

    # --- the model --------------------------------------------------------------------------

    def fitted(self) -> CostModel | None:
        """The cost model fitted to every measurement so far (None: the workload's size is
        not known yet); refitted once a result came in."""
        if self._model is None:
            return None
        return self._fits.get(
            tuple(self._history.order), lambda: fit(self._observations(), self.prior)
        )

    def _measurements(self) -> list[tuple[str, Entry, float, float]]:
        """Every step time measured ok of a configuration the search knows: its name, its
        entry, the seconds per step and how much to trust it (1: a quiet, whole window)."""
        measurements = []
        for name, result in self._history.results.items():
            base = self._history.config_of(name)
            entry = self._history.entries.get(base)
            if entry is None or not result.ok or result.metrics is None:
                continue
            scale = DISTURBED_NOISE_SCALE if result.metrics.disturbed else 1.0
            if result.stopped_after_steps is not None:
                scale *= STOPPED_NOISE_SCALE
            measurements.append((base, entry, result.metrics.latency, scale))
        return measurements

    def _observations(self) -> list[Observation]:
        return [
            Observation(
                tuple(self._counts(entry)),
                latency,
                config=base,
                variant=entry.variant.label,
                noise_scale=scale,
            )
            for base, entry, latency, scale in self._measurements()
        ]

    def _counts(self, entry: Entry) -> list[float]:
        assert self._model is not None
        values = {**self._index.base, **dict(entry.knobs)}
        shape = step_shape(self._config, values, entry.variant, entry.micro_batch_size)
        return step_counts(self._model, shape, self.topology)

    # --- proposing --------------------------------------------------------------------------

    def open_indices(self) -> list[int]:
        """The configurations that may still run: neither run nor in flight, not pruned, and
        below any micro-batch that ran out of memory (same variant and knobs) or out of data."""
        ruled_out = self._ruled_out
        data = self._bounds.data_ceiling_size()
        result = []
        for (variant, knobs), indices in self._index.groups.items():
            if variant.label in ruled_out:
                continue
            ceiling = self._bounds.oom_floor_size(variant, knobs)
            if data is not None:
                ceiling = data if ceiling is None else min(ceiling, data)
            for i in indices:
                name = self._index.names[i]
                if ceiling is not None and self._index.keys[i][1] >= ceiling:
                    continue
                if self._history.is_free(name) and name not in self._excluded:
                    result.append(i)
        return result

    def scored(self, best: Ranked | None = None) -> list[Scored]:
        """Every open configuration with its prediction, its gain over ``best`` (the best
        measured, if any), and its chance to fit in memory."""
        model = self.fitted()
        if model is None or self._index.rows is None:
            return []
        indices = self.open_indices()
        if not indices:
            return []
        idx = np.array(indices)
        log_latency, jac = model.gradients(self._index.rows[idx])
        covariance = np.array(model.covariance)
        param_var = np.einsum("ij,jk,ik->i", jac, covariance, jac)
        residuals = Residuals(self.measured_residuals(model), model)
        keys = [self._index.keys[i] for i in indices]
        shift, residual_var = residuals.posterior(keys)
        log_latency = log_latency + shift
        sd = np.sqrt(np.maximum(1e-12, param_var + residual_var))
        mean = self._metric_log(self._index.samples[idx], log_latency)
        gain, gain_sd = np.zeros(len(indices)), sd
        if best is not None:
            entry = self._history.entries[best.name]
            key = (entry.variant, entry.micro_batch_size, entry.knobs)
            row = np.array([self._counts(entry)])
            best_log, best_jac = model.gradients(row)
            (best_shift,), (best_var,) = residuals.posterior([key])
            samples = entry.micro_batch_size * accumulation_steps(self._config, key[1])
            best_mean = self._metric_log(
                np.array([samples * self.topology.world_size]), best_log + best_shift
            )[0]
            gain = mean - best_mean
            difference = jac - best_jac
            gain_var = np.einsum("ij,jk,ik->i", difference, covariance, difference)
            gain_var += residual_var + best_var - 2 * residuals.covariance(keys, key)
            gain_sd = np.sqrt(np.maximum(1e-12, gain_var))
        fits = self._chance.probabilities(indices)
        dominated = self._dominated(indices) | self._far_below_what_fits(indices, fits)
        fit_probability = np.where(dominated, 0.0, fits)
        names, keys = self._index.names, self._index.keys
        columns = (column.tolist() for column in (mean, sd, fit_probability, gain, gain_sd))
        return [
            Scored(names[i], keys[i], m, s, f, g, g_sd)
            for i, m, s, f, g, g_sd in zip(indices, *columns, strict=True)
        ]

    def predicted(self, names: Sequence[str]) -> dict[str, float]:
        """What the model, corrected by what ran, predicts of each configuration named (its
        metric, in the metric's unit), measured or not; names outside the space are left
        out."""
        model = self.fitted()
        index = self._index.index
        indices = [index[name] for name in names if name in index]
        if model is None or self._index.rows is None or not indices:
            return {}
        log_latency, _ = model.gradients(self._index.rows[np.array(indices)])
        shift, _ = Residuals(self.measured_residuals(model), model).posterior(
            [self._index.keys[i] for i in indices]
        )
        samples = self._index.samples[np.array(indices)]
        values = self._metric_log(samples, log_latency + shift)
        sign = -1.0 if self._metric.lower_is_better else 1.0
        return {
            self._index.names[i]: math.exp(sign * float(v))
            for i, v in zip(indices, values, strict=True)
        }

    def _metric_log(self, samples: np.ndarray, log_latency: np.ndarray) -> np.ndarray:
        """The metric's log from the step time's, oriented so that higher is better."""
        if self._metric.lower_is_better:
            return -log_latency
        return np.log(samples) - log_latency

    def next(self, best: Ranked | None) -> str | None:
        """The configuration to measure next, or None when none is worth it: nothing open,
        or nothing that could beat ``best`` (the best measured) by more than the tolerance."""
        candidates = [s for s in self.scored(best) if s.fit_probability > 0]
        if not candidates:
            return None
        if best is None:
            # Nothing ran ok yet: the best predicted among those as likely to fit as not (where
            # memory ends is the first thing to learn; halving, in effect, without an estimate).
            likely = [s for s in candidates if s.fit_probability >= 0.5]
            if not likely:
                return max(candidates, key=lambda s: (s.fit_probability, s.mean)).name
            return max(likely, key=lambda s: s.mean).name
        if not worth_measuring(candidates):
            return self._uncovered(candidates)
        chosen = max(
            candidates,
            key=lambda s: s.fit_probability * expected_improvement(s.gain, s.gain_sd, 0.0),
        )
        return chosen.name

    def _uncovered(self, candidates: Sequence[Scored]) -> str | None:
        """The best-predicted configuration of a variant nothing of ran ok yet, among those
        likely to fit: every variant is measured once before the model's word alone ends
        the search (a noisy first measurement misleads the fit, and an unmeasured stage is
        the model's least certain guess)."""
        measured = {
            self._history.entries[name].variant
            for name, result in self._history.results.items()
            if result.ok and name in self._history.entries
        }
        uncovered = [
            s
            for s in candidates
            if s.key[0] not in measured and s.fit_probability >= MIN_FIT_PROBABILITY
        ]
        if not uncovered:
            return None
        return max(uncovered, key=lambda s: s.mean + math.log(s.fit_probability)).name

    def unmeasured(self) -> dict[str, int]:
        """Per variant, how many configurations were never run and may still run."""
        counts: dict[str, int] = {}
        for i in self.open_indices():
            label = self._index.keys[i][0].label
            counts[label] = counts.get(label, 0) + 1
        return counts

    def _dominated(self, indices: list[int]) -> np.ndarray:
        """Which configurations were measured at a micro-batch the model says is at least as
        good, with the same variant and knobs (larger for throughput and FLOPS, smaller for
        latency): every cost it counts falls per sample as the micro-batch grows, so such a
        one can beat what was measured only by noise, and measuring that again says more."""
        measured: dict[tuple[Variant, Knobs], list[int]] = {}
        for name, result in self._history.results.items():
            entry = self._history.entries.get(name)
            if entry is None or not result.ok or self._at_the_edge(entry.variant, result):
                continue
            measured.setdefault((entry.variant, entry.knobs), []).append(entry.micro_batch_size)
        lower = self._metric.lower_is_better
        dominated = np.zeros(len(indices), dtype=bool)
        for group, present in self._index.present_by_group(indices).items():
            sizes = measured.get(group)
            if not sizes:
                continue
            bound = min(sizes) if lower else max(sizes)
            for position, size in present:
                dominated[position] = size >= bound if lower else size <= bound
        return dominated

    def _far_below_what_fits(self, indices: list[int], fits: np.ndarray) -> np.ndarray:
        """Configurations at under half the largest micro-batch of their variant and knobs
        that likely fits: by every count the model keeps, the larger one is better per
        sample, and its measurement says more (throughput and FLOPS; for latency, a smaller
        micro-batch is the point)."""
        far = np.zeros(len(indices), dtype=bool)
        if self._metric.lower_is_better:
            return far
        for present in self._index.present_by_group(indices).values():
            largest = max((size for position, size in present if fits[position] >= 0.5), default=0)
            for position, size in present:
                far[position] = 2 * size < largest
        return far

    def _at_the_edge(self, variant: Variant, result: ExperimentResult) -> bool:
        """Whether ``result`` ran with its memory nearly full (within :data:`EDGE_SHARE` of
        the device's): there the allocator's retries can slow a step, so a smaller
        micro-batch may be faster after all."""
        estimate = self._index.plans[variant].estimate if variant in self._index.plans else None
        if estimate is None or result.metrics is None:
            return False
        return result.metrics.peak_memory_bytes > (1 - EDGE_SHARE) * estimate.budget_bytes

    # --- memory -----------------------------------------------------------------------------

    # --- the residual process ---------------------------------------------------------------

    def measured_residuals(self, model: CostModel) -> list[tuple[Key, float, float]]:
        """Per measured configuration: its key, the mean residual of its log step times
        against the model, and that mean's noise variance."""
        groups: dict[str, list[tuple[float, float]]] = {}
        entries: dict[str, Entry] = {}
        for base, entry, latency, scale in self._measurements():
            groups.setdefault(base, []).append((math.log(latency), scale))
            entries[base] = entry
        if not groups:
            return []
        names = list(groups)
        predicted, _ = model.gradients(np.array([self._counts(entries[n]) for n in names]))
        measured = []
        for name, prediction in zip(names, predicted, strict=True):
            weights = [1 / scale**2 for _, scale in groups[name]]
            mean = sum(w * v for w, (v, _) in zip(weights, groups[name], strict=True)) / sum(
                weights
            )
            entry = entries[name]
            measured.append(
                (
                    (entry.variant, entry.micro_batch_size, entry.knobs),
                    mean - float(prediction),
                    model.noise**2 / sum(weights),
                )
            )
        return measured
