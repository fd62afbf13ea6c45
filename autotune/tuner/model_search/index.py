"""Every configuration ``model_based`` may measure, indexed once per space: its key (variant,
micro-batch, knobs), its name, the cost model's counts of its step, the samples it trains a
step, the size of its communication buffers; configurations of one variant and knobs grouped."""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from autotune.config import Config
from autotune.tuner.cost_model import ModelShape, StepShape, Topology, step_counts
from autotune.tuner.space import TuningSpace, Variant, VariantPlan

if TYPE_CHECKING:
    from autotune.tuner.search_space import SearchSpace

Knobs = tuple[tuple[str, Any], ...]
Key = tuple[Variant, int, Knobs]


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
        activation_checkpointing=variant.activation_checkpointing,
        param_persistence_threshold=size("zero_optimization.stage3_param_persistence_threshold"),
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


@dataclass(frozen=True)
class SpaceIndex:
    """The configurations of a space, in a fixed order (each variant's knob points, each at
    every size of its ladder).

    Attributes:
        plans: each variant's plan (its ladder, knobs, memory estimate).
        keys: each configuration's variant, micro-batch and knobs.
        names: each configuration's name.
        index: name → position.
        groups: (variant, knobs) → the positions of its micro-batches, ascending.
        buffers: (variant, knobs) → the elements its communication buffers hold.
        base: the config's own value at every key a configuration may set.
        samples: each configuration's samples a step (all ranks).
        rows: each configuration's counts for the cost model (None: the model is unknown).
    """

    plans: dict[Variant, VariantPlan]
    keys: list[Key]
    names: list[str]
    index: dict[str, int]
    groups: dict[tuple[Variant, Knobs], list[int]]
    buffers: dict[tuple[Variant, Knobs], float]
    samples: np.ndarray
    rows: np.ndarray | None
    base: dict[str, Any]

    def present_by_group(
        self, indices: list[int]
    ) -> dict[tuple[Variant, Knobs], list[tuple[int, int]]]:
        """``indices``' positions in that list and micro-batches, by variant and knobs: a
        decision scores thousands of configurations of a few groups, so each group's lookups
        are made once."""
        position_of = {i: position for position, i in enumerate(indices)}
        grouped = {}
        for group, members in self.groups.items():
            present = [(position_of[i], self.keys[i][1]) for i in members if i in position_of]
            if present:
                grouped[group] = present
        return grouped

    @classmethod
    def build(
        cls,
        config: Config,
        search: SearchSpace,
        space: TuningSpace,
        model: ModelShape | None,
        topology: Topology,
    ) -> SpaceIndex:
        keys: list[Key] = []
        shapes: list[StepShape] = []
        for plan in space.plans:
            dims = [key for key, _ in plan.knobs]
            for point in itertools.product(*(values for _, values in plan.knobs)):
                knobs = tuple(zip(dims, point, strict=True))
                values = {**space.base, **dict(knobs)}
                for size in plan.ladder:
                    keys.append((plan.variant, size, knobs))
                    shapes.append(step_shape(config, values, plan.variant, size))
        names = [search.name_of(search.entry_at(*key)) for key in keys]
        groups: dict[tuple[Variant, Knobs], list[int]] = {}
        for i, (variant, _, knobs) in enumerate(keys):
            groups.setdefault((variant, knobs), []).append(i)
        num_params = model.num_params if model is not None else 1 << 62
        return cls(
            plans={plan.variant: plan for plan in space.plans},
            keys=keys,
            names=names,
            index={name: i for i, name in enumerate(names)},
            groups=groups,
            buffers={
                (key[0], key[2]): _buffer_elements(shape, num_params)
                for key, shape in zip(keys, shapes, strict=True)
            },
            samples=np.array(
                [s.micro_batch_size * s.accumulation * topology.world_size for s in shapes],
                dtype=float,
            ),
            rows=(
                np.array([step_counts(model, s, topology) for s in shapes], dtype=float)
                if model is not None and shapes
                else None
            ),
            base=dict(space.base),
        )


def _buffer_elements(shape: StepShape, num_params: int) -> float:
    """How large a configuration's communication buffers are, in elements (what its knobs
    add to its memory: buckets, stage 3's prefetch), to compare knob points by."""
    buckets = [shape.reduce_bucket_size, shape.allgather_bucket_size]
    if shape.stage == 3:
        buckets.append(shape.prefetch_bucket_size)
    return sum(min(b if b is not None else num_params, num_params) for b in buckets)
