"""What the tuner may try: stages, micro-batch sizes and per-stage knobs, from the user's config.

Defaults, each replaced by a list the user gives at that key:

- **stages**: the user's stage if the config sets one, otherwise all four (as DeepSpeed's
  autotuner does); ``"all"`` or a list searches those.
- **micro-batch sizes**: tuned unless the config fixes them (a micro-batch, or a global batch
  with accumulation). The search for the largest size that fits starts at the memory
  estimate's largest fit (or the largest allowed, without an estimate), brackets it between a
  fit and an ``oom`` and bisects to the exact size; then the largest fit and the
  ``num_tuning_micro_batch_sizes`` - 1 sizes below it, each about half the previous, are
  compared. A fixed
  ``train_batch_size`` admits only sizes that divide it (accumulation is derived); otherwise
  ``max_train_batch_size`` bounds the global batch.
- **knobs** (``fast: false`` only; the default grids of :data:`autotune.config.knobs.KNOBS`):
  stage 1 ``reduce_bucket_size`` and ``allgather_bucket_size``; stage 2 adds ``overlap_comm``,
  ``reduce_scatter`` and ``contiguous_gradients``; stage 3 tunes its own ``stage3_*`` sizes
  instead. Sizes at or above the model's parameter count all behave alike (one bucket holds
  everything), so they collapse into one and fractions of the model take their place. Knobs
  the user lists are searched even with ``fast: true``, at every stage whose engine reads them.
- **offload**: a stage that cannot fit even at the smallest micro-batch is tried with the
  optimizer offloaded to CPU, if that fits.

Everything else in the user's config is kept in every candidate.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from autotune.config import Config, ConfigError, OffloadDevice
from autotune.config.keys import get_key
from autotune.config.knobs import (
    ACCUMULATION_KEY,
    ALL_STAGES,
    CHECKPOINTING_KEY,
    MICRO_BATCH_KEY,
    OFFLOAD_KEY,
    STAGE_KEY,
)
from autotune.tuner.knob_grid import current_values, knob_dims
from autotune.tuner.memory import DEFAULT_MARGIN_FRACTION, MemoryEstimate, estimate_memory
from autotune.tuner.naming import candidate_name

if TYPE_CHECKING:
    from autotune.profiling.model_info import ModelInfo


@dataclass(frozen=True, order=True)
class Variant:
    """A ZeRO stage, with or without the optimizer offloaded to CPU, with or without
    activation checkpointing: what memory decides on."""

    stage: int
    offload_optimizer: bool = False
    activation_checkpointing: bool = False
    # A decision of model_based hashes variants some 100,000 times (the keys of its search):
    # hashed once, here, not field by field each time.
    _hash: int = field(default=0, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        fields = (self.stage, self.offload_optimizer, self.activation_checkpointing)
        object.__setattr__(self, "_hash", hash(fields))

    def __hash__(self) -> int:
        return self._hash

    @property
    def label(self) -> str:
        """``z2``, ``z2_ocpu`` with the optimizer offloaded, ``z2_ac`` checkpointed."""
        return (
            f"z{self.stage}"
            + ("_ocpu" if self.offload_optimizer else "")
            + ("_ac" if self.activation_checkpointing else "")
        )


@dataclass(frozen=True)
class VariantPlan:
    """How one variant is searched.

    Attributes:
        variant: the stage and offload choice.
        ladder: micro-batch sizes the search may visit, ascending (every allowed size).
        start: where the search for the largest micro-batch that fits begins.
        num_micro_batches: how many sizes the micro-batch phase compares.
        halving: compare sizes about half apart below the largest fit (the default), rather
            than the largest fitting sizes of ``ladder`` (the user listed them).
        knobs: the knobs tuned after the micro-batch, each with the values tried.
        estimate: the memory estimate, when the model and a device budget are known.
    """

    variant: Variant
    ladder: tuple[int, ...]
    start: int
    num_micro_batches: int
    knobs: tuple[tuple[str, tuple[Any, ...]], ...]
    estimate: MemoryEstimate | None = None
    halving: bool = True

    @property
    def ceiling(self) -> int | None:
        """The estimate's largest fit with no margin: above the start, a first guess at where
        memory really ends (the margin covers what the estimate leaves out, often little)."""
        if self.estimate is None:
            return None
        return replace(self.estimate, margin_fraction=0.0).max_micro_batch_size(self.ladder[-1])

    def compared_sizes(self, largest_fit: int) -> tuple[int, ...]:
        """The micro-batch sizes to compare once ``largest_fit`` is known, largest first.

        Example:
            >>> plan = VariantPlan(Variant(1), tuple(range(1, 65)), 64, 3, ())
            >>> plan.compared_sizes(45)
            (45, 22, 11)
        """
        fitting = tuple(s for s in self.ladder if s <= largest_fit)
        chosen = halving_chain(fitting, largest_fit) if self.halving else fitting
        return tuple(reversed(chosen[-self.num_micro_batches :]))


@dataclass(frozen=True)
class TuningSpace:
    """Every variant worth trying, and how a candidate becomes config overrides and a name.

    Attributes:
        plans: one per variant tried, in stage order.
        fixed: overrides every candidate carries (the first value of a list the user gave at a
            key that is not being tuned there), so every candidate is a concrete config.
        base: the user's value at every key a candidate may set (for names).
        pruned: variant label → why it is not tried.
        sizes: the micro-batch sizes the config allows (those of a variant pruned before the
            search are its configurations not run).
        stages: the stages searched.
        knob_keys_by_stage: the knobs tuned at each stage searched.
    """

    plans: tuple[VariantPlan, ...]
    fixed: Mapping[str, Any]
    base: Mapping[str, Any]
    pruned: Mapping[str, str] = field(default_factory=dict)
    sizes: tuple[int, ...] = ()
    stages: tuple[int, ...] = ALL_STAGES
    knob_keys_by_stage: Mapping[int, tuple[str, ...]] = field(default_factory=dict)

    def overrides(
        self, variant: Variant, micro_batch_size: int, knobs: Mapping[str, Any] | None = None
    ) -> dict[str, Any]:
        """The dotted-key overrides of one candidate."""
        return _overrides(self.fixed, variant, micro_batch_size, knobs or {})

    def name(self, overrides: Mapping[str, Any]) -> str:
        return candidate_name(overrides, self.base)

    def knob_keys(self, stage: int) -> tuple[str, ...]:
        """The knobs tuned at ``stage`` (the same for each of its variants, whatever the
        model's size), in the order names show them."""
        return self.knob_keys_by_stage.get(stage, ())

    @property
    def num_configurations(self) -> int:
        """Configurations a search can run: every size of each variant's ladder, then its
        knob points at one micro-batch."""
        return sum(
            len(plan.ladder) + (math.prod(len(v) for _, v in plan.knobs) if plan.knobs else 0)
            for plan in self.plans
        )


def build_space(
    config: Config,
    model_info: ModelInfo | None = None,
    device_memory_bytes: int | None = None,
    margin_fraction: float = DEFAULT_MARGIN_FRACTION,
) -> TuningSpace:
    """The search space for ``config`` (see the module docstring for the rules).

    Args:
        config: the user's config, search lists included.
        model_info: the workload's sizes; without it there is no memory estimate and the
            micro-batch search starts from the largest allowed size.
        device_memory_bytes: the per-rank device budget; without it, no memory estimate.
        margin_fraction: share of the budget the estimate leaves free.

    Raises:
        ConfigError: if no micro-batch size satisfies the batch limits.

    Example:
        >>> from autotune.config import load_config
        >>> space = build_space(load_config({"zero_optimization": {"stage": [1, 2]}}, 2))
        >>> [p.variant.label for p in space.plans]
        ['z1', 'z2']
        >>> space.plans[0].ladder[:3], space.plans[0].ladder[-1]  # every allowed size
        ((1, 2, 3), 1024)
    """
    searched = config.search_space
    own_axes = (STAGE_KEY, MICRO_BATCH_KEY, CHECKPOINTING_KEY)
    fixed = {k: v[0] for k, v in searched.items() if k not in own_axes}
    base = {**current_values(config), **fixed}
    user_offload = config.zero_optimization.optimizer_offload_device is OffloadDevice.cpu
    sizes, user_chose_sizes = micro_batch_sizes(config)
    num_params = model_info.num_params if model_info is not None else None

    plans: list[VariantPlan] = []
    pruned: dict[str, str] = {}
    for stage, checkpointed in (
        (stage, ckpt) for stage in _stages(config) for ckpt in _checkpointing(config)
    ):
        variant = Variant(stage, user_offload, checkpointed)
        estimate = None
        if model_info is not None and device_memory_bytes is not None:
            estimate = estimate_memory(
                model_info,
                config,
                stage,
                user_offload,
                device_memory_bytes,
                margin_fraction,
                checkpointed,
            )
            # Pruning is final, so it goes by the model states alone (the ZeRO formulas, which
            # hold); the buffers, calibrated on one engine, only move the start and the order.
            if not _states_fit(estimate, sizes[0]) and not user_offload and stage > 0:
                offloaded = estimate_memory(
                    model_info,
                    config,
                    stage,
                    True,
                    device_memory_bytes,
                    margin_fraction,
                    checkpointed,
                )
                if _states_fit(offloaded, sizes[0]):
                    pruned[variant.label] = f"{estimate.explain(sizes[0])}; offloading instead"
                    variant, estimate = Variant(stage, True, checkpointed), offloaded
            if not _states_fit(estimate, sizes[0]):
                pruned[variant.label] = estimate.explain(sizes[0])
                continue
        # Sizes whose config breaks a rule (e.g. one that cannot keep a fixed global batch)
        # are dropped here, so the search steps over them instead of stopping at them.
        valid, rejection = [], ""
        for size in sizes:
            try:
                config.with_overrides(_overrides(fixed, variant, size, {}))
                valid.append(size)
            except ConfigError as err:
                rejection = str(err)
        if not valid:
            pruned[variant.label] = rejection
            continue
        largest = estimate.max_micro_batch_size(valid[-1]) if estimate else valid[-1]
        start = max((s for s in valid if s <= largest), default=valid[0])
        knobs = knob_dims(config, stage, num_params)
        count = len(valid) if user_chose_sizes else config.autotuning.num_tuning_micro_batch_sizes
        plans.append(
            VariantPlan(
                variant, tuple(valid), start, count, knobs, estimate, halving=not user_chose_sizes
            )
        )
    knob_keys = {
        stage: tuple(key for key, _ in knob_dims(config, stage, num_params))
        for stage in _stages(config)
    }
    return TuningSpace(tuple(plans), fixed, base, pruned, tuple(sizes), _stages(config), knob_keys)


def _states_fit(estimate: MemoryEstimate, micro_batch_size: int) -> bool:
    return replace(estimate, buffer_bytes=0).fits(micro_batch_size)


def _overrides(
    fixed: Mapping[str, Any], variant: Variant, micro_batch_size: int, knobs: Mapping[str, Any]
) -> dict[str, Any]:
    result = {**fixed, STAGE_KEY: variant.stage, MICRO_BATCH_KEY: micro_batch_size}
    if variant.offload_optimizer:
        result[OFFLOAD_KEY] = OffloadDevice.cpu.value
    if variant.activation_checkpointing:
        result[CHECKPOINTING_KEY] = True
    return {**result, **knobs}


def micro_batch_sizes(config: Config) -> tuple[tuple[int, ...], bool]:
    """The micro-batch sizes allowed, ascending, and whether the user chose them explicitly.

    Raises:
        ConfigError: if the batch limits leave no size.
    """
    listed = config.search_space.get(MICRO_BATCH_KEY)
    if listed:
        return tuple(sorted(listed)), True
    spec = config.spec
    triad = ("train_batch_size", MICRO_BATCH_KEY, ACCUMULATION_KEY)
    given: dict[str, int] = {k: spec[k] for k in triad if isinstance(spec.get(k), int)}
    micro = config.train_micro_batch_size_per_gpu
    if isinstance(micro, int) and (MICRO_BATCH_KEY in given or len(given) >= 2):
        return (micro,), True  # the user's config determines it
    tuning, n = config.autotuning, config.world_size
    global_batch = given.get("train_batch_size")
    accumulation = given.get(ACCUMULATION_KEY, 1)

    def allowed(size: int) -> bool:
        if global_batch is not None:  # accumulation is derived, so the size must divide it
            return global_batch % (size * n) == 0
        total = size * accumulation * n
        limit = tuning.max_train_batch_size
        return total >= tuning.min_train_batch_size and (limit is None or total <= limit)

    lo, hi = tuning.min_train_micro_batch_size_per_gpu, tuning.max_train_micro_batch_size_per_gpu
    sizes = tuple(s for s in range(lo, hi + 1) if allowed(s))
    if not sizes:
        raise ConfigError(
            "autotuning.max_train_micro_batch_size_per_gpu",
            f"no micro-batch size in [{lo}, {hi}] fits the batch limits (train_batch_size "
            f"{global_batch}, max_train_batch_size {tuning.max_train_batch_size}, world size {n})",
        )
    return sizes, False


def halving_chain(sizes: tuple[int, ...], start: int) -> tuple[int, ...]:
    """Sizes from ``sizes``, each about half the previous, from ``start`` down, ascending.

    The throughput curve flattens with the micro-batch, so sizes about half apart show its
    shape with few experiments.
    """
    chain = [start]
    while below := [s for s in sizes if s <= chain[-1] // 2]:
        chain.append(max(below))
    return tuple(sorted(chain))


def _checkpointing(config: Config) -> tuple[bool, ...]:
    """Activation checkpointing off, on, or both where the config lists both (off first: it
    is faster wherever the model fits without it)."""
    listed = config.search_space.get(CHECKPOINTING_KEY)
    if listed:
        return tuple(sorted(listed))
    return (config.activation_checkpointing.enabled,)


def _stages(config: Config) -> tuple[int, ...]:
    listed = config.search_space.get(STAGE_KEY)
    if listed:
        return tuple(sorted(listed))
    if get_key(config.spec, STAGE_KEY) is not None:  # the user chose one
        return (config.zero_optimization.stage,)
    return ALL_STAGES
