"""``model_based``: predict every configuration, measure the one most likely to beat the best.

Every configuration of the space (each variant's micro-batch sizes, times its knob points) is
predicted by the cost model (:mod:`autotune.tuner.cost_model`), refitted to everything
measured so far, and by the memory estimate. The next experiment is the configuration with
the largest expected improvement over the best measured, times the chance that it fits in
memory; the search ends when no configuration left could, even optimistically (the upper end
of its prediction's 80% interval), beat the best measured by more than the tolerance.

Where the model is wrong near what was measured, its residuals say so: they are smoothed over
nearby configurations (same variant, micro-batches a few times apart, the same knob values),
a Gaussian process on the residuals, so a configuration next to a measured one is predicted
from that measurement and one in a variant nothing of has run carries the model's full
uncertainty. Every cost the model counts falls per sample as the micro-batch grows, so a
configuration measured at a larger micro-batch (same variant and knobs) bounds the smaller
ones: they can beat it only by noise, and are not measured; except where memory was nearly
full, which can slow a step (the allocator's retries) in ways no count shows.

Memory: a size no larger than one that ran ok fits; one at or above an ``oom`` does not.
Between, where the variant's memory ends is uncertain: the estimate puts it somewhere (the
largest micro-batch whose estimated bytes fit, within a factor of e^0.5 either way, or within
5% once its line goes through peaks measured in that variant), and what ran truncates that
guess; without an estimate, the chance falls linearly from the largest fit to the smallest
``oom`` (a bisection, in effect).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from autotune.config import Config, Metric
from autotune.experiment import ExperimentResult, Status
from autotune.tuner.bounds import Bounds
from autotune.tuner.catalog import Catalog
from autotune.tuner.cost_model import (
    CostModel,
    ModelShape,
    Observation,
    Prior,
    StepShape,
    Topology,
    expected_improvement,
    fit,
    normal_cdf,
    prior_for,
    step_counts,
)
from autotune.tuner.hardware import Hardware
from autotune.tuner.ledger import Entry, Ledger
from autotune.tuner.ranking import TOLERANCE, Ranked
from autotune.tuner.space import TuningSpace, Variant

Knobs = tuple[tuple[str, Any], ...]
Key = tuple[Variant, int, Knobs]

# The upper end of a prediction the stopping rule looks at: one-sided 90%.
OPTIMISM_Z = 1.28
# Configurations less likely than this to fit are not worth waiting for.
MIN_FIT_PROBABILITY = 0.25
# Uncertainty of the log of the largest micro-batch that fits, from the memory estimate alone
# (estimates were off by up to 3x on the committed landscapes) and once peaks were measured.
MEMORY_SD_ESTIMATED = 0.5
MEMORY_SD_CALIBRATED = 0.05
# ... and for a variant none of whose peaks was measured, once another's were.
MEMORY_SD_TRANSFERRED = 0.15
# How alike two configurations' misfits are (the residual process's kernel), beyond what
# their variant shares: micro-batches this many e-folds apart keep e^-1/2 of it, each knob
# that differs keeps this share.
MICRO_BATCH_SCALE = math.log(4.0)
KNOB_CORRELATION = 0.8
# The share of device memory under which a step may slow down as the allocator retries.
EDGE_SHARE = 0.05
# A measurement taken while the machine was busy, or cut short as a loser, says less.
DISTURBED_NOISE_SCALE = 3.0
STOPPED_NOISE_SCALE = 1.5


@dataclass(frozen=True)
class Scored:
    """A configuration not yet measured, as the model sees it now.

    Attributes:
        name: its name.
        key: its variant, micro-batch and knobs.
        mean: the predicted metric's log, oriented so that higher is better.
        sd: the prediction's standard deviation (constants, misfit).
        fit_probability: the chance that it fits in memory.
        gain: the predicted log of how much better than the best measured it is (its
            prediction less the model's for the best measured, both corrected by what ran).
        gain_sd: that difference's standard deviation: small between near neighbours,
            whose errors go together.
    """

    name: str
    key: Key
    mean: float
    sd: float
    fit_probability: float
    gain: float = 0.0
    gain_sd: float = 0.0

    @property
    def optimistic_gain(self) -> float:
        """The upper end of how much better than the best measured it could be (the log of
        the ratio, one-sided 90%)."""
        return self.gain + OPTIMISM_Z * self.gain_sd


def step_shape(
    config: Config, values: dict[str, Any], variant: Variant, micro_batch_size: int
) -> StepShape:
    """The cost model's view of ``config`` at ``variant`` and ``micro_batch_size``, with the
    knob ``values`` (dotted keys) in place of the config's own."""

    def size(key: str) -> float | None:
        value = values.get(key)
        if isinstance(value, bool) or not isinstance(value, int | float):
            return None  # "auto": one bucket
        return float(value)

    overlap = values.get("zero_optimization.overlap_comm")
    return StepShape(
        stage=variant.stage,
        micro_batch_size=micro_batch_size,
        accumulation=accumulation_steps(config, micro_batch_size),
        offload_optimizer=variant.offload_optimizer,
        # "auto" (the HF Trainer fills it in): DeepSpeed's default, on at stage 3.
        overlap_comm=overlap is True or (overlap == "auto" and variant.stage == 3),
        reduce_scatter=values.get("zero_optimization.reduce_scatter", True) is not False,
        reduce_bucket_size=size("zero_optimization.reduce_bucket_size"),
        allgather_bucket_size=size("zero_optimization.allgather_bucket_size"),
        prefetch_bucket_size=size("zero_optimization.stage3_prefetch_bucket_size"),
    )


def accumulation_steps(config: Config, micro_batch_size: int) -> int:
    """Gradient accumulation at ``micro_batch_size``: derived from a ``train_batch_size`` the
    user fixed, else the config's own (1 unless set)."""
    spec = config.spec
    data_parallel = max(1, config.world_size // config.autotuning.mp_size)
    batch = spec.get("train_batch_size")
    if isinstance(batch, int) and not isinstance(batch, bool):
        return max(1, batch // (micro_batch_size * data_parallel))
    steps = spec.get("gradient_accumulation_steps")
    return steps if isinstance(steps, int) and not isinstance(steps, bool) and steps > 0 else 1


def metric_log(metric: Metric, value: float) -> float:
    """The log of a metric's value, oriented so that higher is better."""
    return -math.log(value) if metric.lower_is_better else math.log(value)


class ModelSearch:
    """The ``model_based`` search over the catalog's space (see the module docstring).

    Args:
        config: the user's config (precision, world size, batch rules).
        catalog: the configurations by name (the space searched now).
        ledger: what the tuner has seen.
        bounds: what failures prune.
        hardware: the datasheet the constants start from.
        ranks_per_node: ranks sharing a node's links.
        model: the workload's size and FLOPs (None: unknown yet; see :meth:`use_space`).
        prior: where the constants start (None: the datasheet's, :func:`prior_for`).
    """

    def __init__(
        self,
        config: Config,
        catalog: Catalog,
        ledger: Ledger,
        bounds: Bounds,
        hardware: Hardware,
        ranks_per_node: int,
        model: ModelShape | None,
        prior: Prior | None = None,
    ) -> None:
        self._config = config
        self._catalog = catalog
        self._ledger = ledger
        self._bounds = bounds
        self._metric: Metric = config.autotuning.metric
        data_parallel = max(1, config.world_size // config.autotuning.mp_size)
        self.topology = Topology(
            data_parallel, min(ranks_per_node, data_parallel), config.precision
        )
        # What earlier runs on this hardware fitted, where there is that; else the datasheet.
        self.prior = prior or prior_for(hardware, self.topology)
        self._model = model
        self._fitted: tuple[int, CostModel] | None = None
        self.use_space(catalog.space, model)

    def use_space(self, space: TuningSpace, model: ModelShape | None) -> None:
        """Search ``space`` from now on (the model's size learnt: the estimates changed)."""
        self._model = model
        self._space = space
        self._plans = {plan.variant: plan for plan in space.plans}
        keys: list[Key] = []
        shapes: list[StepShape] = []
        for plan in space.plans:
            dims = [key for key, _ in plan.knobs]
            for point in itertools.product(*(values for _, values in plan.knobs)):
                knobs = tuple(zip(dims, point, strict=True))
                values = {**space.base, **dict(knobs)}
                for size in plan.ladder:
                    keys.append((plan.variant, size, knobs))
                    shapes.append(step_shape(self._config, values, plan.variant, size))
        self._keys = keys
        self._names = [self._catalog.name_of(*key) for key in keys]
        self._index = {name: i for i, name in enumerate(self._names)}
        self._groups: dict[tuple[Variant, Knobs], list[int]] = {}
        for i, (variant, _, knobs) in enumerate(keys):
            self._groups.setdefault((variant, knobs), []).append(i)
        self._sizes = np.array([key[1] for key in keys], dtype=float)
        num_params = model.num_params if model is not None else 1 << 62
        self._buffers = {
            (key[0], key[2]): _buffer_elements(shape, num_params)
            for key, shape in zip(keys, shapes, strict=True)
        }
        self._samples = np.array(
            [s.micro_batch_size * s.accumulation * self.topology.world_size for s in shapes],
            dtype=float,
        )
        self._rows = (
            np.array([step_counts(model, s, self.topology) for s in shapes], dtype=float)
            if model is not None and shapes
            else None
        )
        self._fitted = None

    def __contains__(self, name: object) -> bool:
        return name in self._index

    def key_of(self, name: str) -> Key | None:
        """The variant, micro-batch and knobs ``name`` names (None: not in the space)."""
        index = self._index.get(name)
        return None if index is None else self._keys[index]

    # --- the model --------------------------------------------------------------------------

    def fitted(self) -> CostModel | None:
        """The cost model fitted to every measurement so far (None: the workload's size is
        not known yet); refitted once a result came in."""
        if self._model is None:
            return None
        count = len(self._ledger.results)
        if self._fitted is None or self._fitted[0] != count:
            self._fitted = (count, fit(self._observations(), self.prior))
        return self._fitted[1]

    def _measurements(self) -> list[tuple[str, Entry, float, float]]:
        """Every step time measured ok of a configuration the search knows: its name, its
        entry, the seconds per step and how much to trust it (1: a quiet, whole window)."""
        measurements = []
        for name, result in self._ledger.results.items():
            base = self._ledger.config_of(name)
            entry = self._ledger.entries.get(base)
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
        values = {**self._space.base, **dict(entry.knobs)}
        shape = step_shape(self._config, values, entry.variant, entry.micro_batch_size)
        return step_counts(self._model, shape, self.topology)

    # --- proposing --------------------------------------------------------------------------

    def open_indices(self) -> list[int]:
        """The configurations that may still run: neither run nor in flight, not pruned, and
        below any micro-batch that ran out of memory (same variant and knobs) or out of data."""
        ruled_out = self._ledger.ruled_out_variants
        data = self._bounds.data_ceiling_size()
        result = []
        for (variant, knobs), indices in self._groups.items():
            if variant.label in ruled_out:
                continue
            ceiling = self._bounds.oom_floor_size(variant, knobs)
            if data is not None:
                ceiling = data if ceiling is None else min(ceiling, data)
            for i in indices:
                name = self._names[i]
                if ceiling is not None and self._keys[i][1] >= ceiling:
                    continue
                if self._ledger.may_propose(name):
                    result.append(i)
        return result

    def scored(self, best: Ranked | None = None) -> list[Scored]:
        """Every open configuration with its prediction, its gain over ``best`` (the best
        measured, if any), and its chance to fit in memory."""
        model = self.fitted()
        if model is None or self._rows is None:
            return []
        indices = self.open_indices()
        if not indices:
            return []
        idx = np.array(indices)
        log_latency, jac = model.gradients(self._rows[idx])
        covariance = np.array(model.covariance)
        param_var = np.einsum("ij,jk,ik->i", jac, covariance, jac)
        residuals = _Residuals(self, model)
        keys = [self._keys[i] for i in indices]
        shift, residual_var = residuals.posterior(keys)
        log_latency = log_latency + shift
        sd = np.sqrt(np.maximum(1e-12, param_var + residual_var))
        mean = self._metric_log(self._samples[idx], log_latency)
        gain, gain_sd = np.zeros(len(indices)), sd
        if best is not None:
            entry = self._ledger.entries[best.name]
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
        fits = self._fit_probabilities(indices)
        dominated = self._dominated(indices) | self._far_below_what_fits(indices, fits)
        fit_probability = np.where(dominated, 0.0, fits)
        return [
            Scored(self._names[i], self._keys[i], *map(float, values))
            for i, *values in zip(indices, mean, sd, fit_probability, gain, gain_sd, strict=True)
        ]

    def predicted(self, names: Sequence[str]) -> dict[str, float]:
        """What the model, corrected by what ran, predicts of each configuration named (its
        metric, in the metric's unit), measured or not; names outside the space are left
        out."""
        model = self.fitted()
        indices = [self._index[name] for name in names if name in self._index]
        if model is None or self._rows is None or not indices:
            return {}
        log_latency, _ = model.gradients(self._rows[np.array(indices)])
        shift, _ = _Residuals(self, model).posterior([self._keys[i] for i in indices])
        values = self._metric_log(self._samples[np.array(indices)], log_latency + shift)
        sign = -1.0 if self._metric.lower_is_better else 1.0
        return {
            self._names[i]: math.exp(sign * float(v)) for i, v in zip(indices, values, strict=True)
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
            self._ledger.entries[name].variant
            for name, result in self._ledger.results.items()
            if result.ok and name in self._ledger.entries
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
            label = self._keys[i][0].label
            counts[label] = counts.get(label, 0) + 1
        return counts

    def _dominated(self, indices: list[int]) -> np.ndarray:
        """Which configurations were measured at a micro-batch the model says is at least as
        good, with the same variant and knobs (larger for throughput and FLOPS, smaller for
        latency): every cost it counts falls per sample as the micro-batch grows, so such a
        one can beat what was measured only by noise, and measuring that again says more."""
        measured: dict[tuple[Variant, Knobs], list[int]] = {}
        for name, result in self._ledger.results.items():
            entry = self._ledger.entries.get(name)
            if entry is None or not result.ok or self._at_the_edge(entry.variant, result):
                continue
            measured.setdefault((entry.variant, entry.knobs), []).append(entry.micro_batch_size)
        lower = self._metric.lower_is_better
        dominated = np.zeros(len(indices), dtype=bool)
        for position, i in enumerate(indices):
            variant, size, knobs = self._keys[i]
            sizes = measured.get((variant, knobs), ())
            dominated[position] = any((s <= size) if lower else (s >= size) for s in sizes)
        return dominated

    def _far_below_what_fits(self, indices: list[int], fits: np.ndarray) -> np.ndarray:
        """Configurations at under half the largest micro-batch of their variant and knobs
        that likely fits: by every count the model keeps, the larger one is better per
        sample, and its measurement says more (throughput and FLOPS; for latency, a smaller
        micro-batch is the point)."""
        far = np.zeros(len(indices), dtype=bool)
        if self._metric.lower_is_better:
            return far
        largest: dict[tuple[Variant, Knobs], int] = {}
        for position, i in enumerate(indices):
            variant, size, knobs = self._keys[i]
            if fits[position] >= 0.5:
                largest[(variant, knobs)] = max(largest.get((variant, knobs), 0), size)
        for position, i in enumerate(indices):
            variant, size, knobs = self._keys[i]
            far[position] = 2 * size < largest.get((variant, knobs), 0)
        return far

    def _at_the_edge(self, variant: Variant, result: ExperimentResult) -> bool:
        """Whether ``result`` ran with its memory nearly full (within :data:`EDGE_SHARE` of
        the device's): there the allocator's retries can slow a step, so a smaller
        micro-batch may be faster after all."""
        estimate = self._plans[variant].estimate if variant in self._plans else None
        if estimate is None or result.metrics is None:
            return False
        return result.metrics.peak_memory_bytes > (1 - EDGE_SHARE) * estimate.budget_bytes

    # --- memory -----------------------------------------------------------------------------

    def _fit_probabilities(self, indices: list[int]) -> np.ndarray:
        """The chance that each configuration fits in memory (see the module docstring)."""
        ok: dict[Variant, list[int]] = {}
        ooms: dict[tuple[Variant, Knobs], list[int]] = {}
        peaks: dict[Variant, list[tuple[int, int]]] = {}
        for name, result in self._ledger.results.items():
            entry = self._ledger.entries.get(name)
            if entry is None:
                continue
            size = entry.micro_batch_size
            if result.ok:
                ok.setdefault(entry.variant, []).append(size)
                if result.metrics is not None and result.metrics.peak_memory_bytes > 0:
                    peaks.setdefault(entry.variant, []).append(
                        (size, result.metrics.peak_memory_bytes)
                    )
            elif result.status is Status.oom:
                ooms.setdefault((entry.variant, entry.knobs), []).append(size)
        boundaries = {variant: self._boundary(variant, peaks) for variant in self._plans}
        # Up to stage 2, a higher stage holds less at the same micro-batch: what fit at a lower
        # stage fits here, what ran out of memory at a higher one does here too. (Stage 3's
        # gathered parameters can outweigh what it saves on a small model.) A fit says as much
        # for the variant's other knob values (buckets are small beside activations); running
        # out of memory only for the same ones (a larger bucket may be what did not fit).
        fits_at = {
            variant: max(
                (
                    size
                    for other, sizes in ok.items()
                    for size in sizes
                    if other == variant or self._holds_less(variant, other, size)
                ),
                default=0,
            )
            for variant in self._plans
        }
        # A knob point inherits an oom from another whose buffers are no larger.
        fails_at: dict[tuple[Variant, Knobs], list[int]] = {}
        for (other, failed_knobs), sizes in ooms.items():
            failed_buffers = self._buffers.get((other, failed_knobs), 0.0)
            for variant, knobs in self._groups:
                if self._buffers[(variant, knobs)] < failed_buffers:
                    continue
                for size in sizes:
                    if other == variant or self._holds_less(other, variant, size):
                        fails_at.setdefault((variant, knobs), []).append(size)
        probabilities = np.ones(len(indices))
        for position, i in enumerate(indices):
            variant, size, knobs = self._keys[i]
            largest_ok = fits_at[variant]
            if largest_ok >= size:
                continue
            failed = fails_at.get((variant, knobs), ())
            smallest_oom = min((s for s in failed if s > largest_ok), default=None)
            probabilities[position] = _beyond(size, largest_ok, smallest_oom, boundaries[variant])
        return probabilities

    def _holds_less(self, variant: Variant, other: Variant, size: int) -> bool:
        """Whether ``variant`` holds no more memory than ``other`` at micro-batch ``size``: by
        the estimates where there are (a stage's buffers can outweigh what it shards on a
        small model), else a higher stage up to 2 with the optimizer offloaded alike."""
        mine, theirs = self._plans[variant].estimate, self._plans[other].estimate
        if mine is not None and theirs is not None:
            return mine.bytes_at(size) <= theirs.bytes_at(size)
        return (
            variant.offload_optimizer == other.offload_optimizer
            and other.stage < variant.stage <= 2
        )

    def _boundary(
        self, variant: Variant, peaks: Mapping[Variant, list[tuple[int, int]]]
    ) -> tuple[float, float] | None:
        """Where the variant's memory ends, as the log of the largest micro-batch that fits
        and the uncertainty of that log: the estimate's line, moved through the peaks
        measured in the variant (its slope too, once two sizes were); without any, scaled by
        how far off the estimate was in the variants measured (the same activations, the
        same allocator); None without an estimate."""
        estimate = self._plans[variant].estimate
        if estimate is None:
            return None
        slope = float(max(1, estimate.activation_bytes_per_sample))
        own = sorted(peaks.get(variant, ()))
        if own:
            (low_size, low_peak), (high_size, high_peak) = own[0], own[-1]
            if high_size > low_size and high_peak > low_peak:
                slope = (high_peak - low_peak) / (high_size - low_size)
            largest = high_size + (estimate.budget_bytes - high_peak) / slope
            return math.log(max(largest, 0.5)), MEMORY_SD_CALIBRATED
        ratios = [
            peak / other_estimate.bytes_at(size)
            for other, measured in peaks.items()
            if (other_estimate := self._plans[other].estimate) is not None
            for size, peak in measured[-1:]
            if other_estimate.bytes_at(size) > 0
        ]
        scale, spread = 1.0, MEMORY_SD_ESTIMATED
        if ratios:
            scale, spread = sum(ratios) / len(ratios), MEMORY_SD_TRANSFERRED
        room = estimate.budget_bytes / scale - estimate.bytes_at(0)
        return math.log(max(room / slope, 0.5)), spread

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


class _Residuals:
    """The Gaussian process on the cost model's residuals (kernel :func:`kernel`: a part the
    whole variant shares, as large as an unmeasured variant's misfit, and a local part, as
    large as the misfit the fit showed), conditioned on what was measured."""

    def __init__(self, search: ModelSearch, model: CostModel) -> None:
        measured = search.measured_residuals(model)
        self._keys = [key for key, _, _ in measured]
        self._variant_var = max(0.0, model.misfit_unmeasured**2 - model.misfit_measured**2)
        self._local_var = model.misfit_measured**2
        self._inverse: np.ndarray = np.zeros((0, 0))
        self._weights: np.ndarray = np.zeros(0)
        if not measured:
            return
        residuals = np.array([r for _, r, _ in measured])
        gram = np.array([[self._kernel(a, b) for b in self._keys] for a in self._keys])
        gram += np.diag([n for _, _, n in measured])
        self._inverse = np.linalg.inv(gram)
        self._weights = self._inverse @ residuals

    def _kernel(self, a: Key, b: Key) -> float:
        return kernel(a, b, self._variant_var, self._local_var)

    def cross(self, keys: Sequence[Key]) -> np.ndarray:
        """The prior covariance of each of ``keys`` with each measured configuration."""
        cross = np.zeros((len(keys), len(self._keys)))
        groups: dict[tuple[Variant, Knobs], list[int]] = {}
        for position, (variant, _, knobs) in enumerate(keys):
            groups.setdefault((variant, knobs), []).append(position)
        log_sizes = np.log(np.array([key[1] for key in keys], dtype=float))
        for (variant, knobs), rows in groups.items():
            for j, (other_variant, other_size, other_knobs) in enumerate(self._keys):
                if other_variant != variant:
                    continue
                distance = (log_sizes[rows] - math.log(other_size)) / MICRO_BATCH_SCALE
                local = np.exp(-0.5 * distance**2) * KNOB_CORRELATION ** _differing(
                    knobs, other_knobs
                )
                cross[rows, j] = self._variant_var + self._local_var * local
        return cross

    def posterior(self, keys: Sequence[Key]) -> tuple[np.ndarray, np.ndarray]:
        """Each key's residual given what was measured: its mean (the shift of its predicted
        log step time) and its variance."""
        prior_var = np.full(len(keys), self._variant_var + self._local_var)
        if not self._keys:
            return np.zeros(len(keys)), prior_var
        cross = self.cross(keys)
        explained = np.einsum("ij,jk,ik->i", cross, self._inverse, cross)
        return cross @ self._weights, np.maximum(0.0, prior_var - explained)

    def covariance(self, keys: Sequence[Key], other: Key) -> np.ndarray:
        """The posterior covariance of each key's residual with ``other``'s."""
        prior = np.array([self._kernel(key, other) for key in keys])
        if not self._keys:
            return prior
        cross = self.cross(keys)
        return prior - cross @ self._inverse @ self.cross([other])[0]


def worth_measuring(candidates: Sequence[Scored]) -> bool:
    """Whether any candidate likely to fit could still beat the best measured by more than
    the tolerance."""
    line = math.log(1.0 + TOLERANCE)
    return any(
        s.optimistic_gain > line for s in candidates if s.fit_probability >= MIN_FIT_PROBABILITY
    )


def kernel(a: Key, b: Key, variant_var: float, local_var: float) -> float:
    """The covariance of the model's misfit at two configurations: ``variant_var`` shared
    by the whole variant (what the model leaves out of a stage's cost), ``local_var`` fading
    with the micro-batches' ratio and each knob that differs."""
    if a[0] != b[0]:
        return 0.0
    distance = (math.log(a[1]) - math.log(b[1])) / MICRO_BATCH_SCALE
    local = math.exp(-0.5 * distance * distance) * KNOB_CORRELATION ** _differing(a[2], b[2])
    return variant_var + local_var * local


def _differing(a: Knobs, b: Knobs) -> int:
    return sum(1 for x, y in zip(a, b, strict=False) if x != y) + abs(len(a) - len(b))


def _buffer_elements(shape: StepShape, num_params: int) -> float:
    """How large a configuration's communication buffers are, in elements (what its knobs
    add to its memory: buckets, stage 3's prefetch), to compare knob points by."""
    buckets = [shape.reduce_bucket_size, shape.allgather_bucket_size]
    if shape.stage == 3:
        buckets.append(shape.prefetch_bucket_size)
    return sum(min(b if b is not None else num_params, num_params) for b in buckets)


def _beyond(size: int, fits: int, fails: int | None, boundary: tuple[float, float] | None) -> float:
    """The chance that the largest micro-batch that fits is at least ``size``, given that
    ``fits`` did and ``fails`` (None: nothing) did not: the boundary's prior (log-normal,
    ``boundary``: mean and standard deviation of its log) truncated to what ran; uniform
    between the two without a prior."""
    if fails is not None and size >= fails:
        return 0.0
    if boundary is None:
        return 1.0 if fails is None else (fails - size) / (fails - fits)
    center, spread = boundary

    def z(x: float) -> float:
        return -math.inf if x <= 0 else (math.log(x) - center) / spread

    top = math.inf if fails is None else z(fails)
    return _tail_share(z(size), z(fits), top)


def _tail_share(x: float, low: float, high: float) -> float:
    """P(X >= x | low <= X < high) for a standard normal X, stable far in either tail."""
    if x <= low:
        return 1.0
    if x >= high:
        return 0.0
    if low > 5.0:  # far in the upper tail: the ratio of the tails, asymptotically
        above = math.exp(-(x * x - low * low) / 2) * low / x
        cut = 0.0 if high == math.inf else math.exp(-(high * high - low * low) / 2) * low / high
        return max(0.0, (above - cut) / (1.0 - cut)) if cut < 1.0 else 0.0
    upper = 1.0 if high == math.inf else normal_cdf(high)
    mass = upper - normal_cdf(low)
    if mass <= 1e-12:
        return 0.0
    return max(0.0, upper - normal_cdf(x)) / mass
