"""What one optimizer step of a ZeRO configuration does, counted: the cost model's rows.

Per optimizer step a rank runs ``g`` micro-steps (gradient accumulation) of ``b`` samples,
the collectives its ZeRO stage issues, the host-side work its hooks do, and the optimizer's
update of its shard. :func:`step_counts` counts each (FLOPs, bytes, calls, parameters,
hooks, module fetches); :mod:`autotune.tuner.cost_model` turns the counts into seconds with
the machine's rates.

============  =================================================================================
compute       ``g·b·F`` FLOPs (F per sample, forward and backward; activation checkpointing
              adds the forward it recomputes), at a rate that rises with the micro-batch
collectives   ring volumes per rank, ``c = (N-1)/N`` of the model's bytes: stage 0
              all-reduces the gradients once a step (``2c``), stage 1 reduce-scatters them
              once a step and all-gathers the updated parameters (``c + c``), stage 2
              reduce-scatters every micro-step (``g·c + c``), stage 3 all-gathers every
              module's parameters for forward and again for backward (and once more for the
              recompute under checkpointing) and reduce-scatters, every micro-step. Calls: one
              per bucket, and at stage 3 one per module gathered, each paying the call's
              latency. A reduction overlaps backward with ``overlap_comm``; stage 3's gathers
              overlap compute through prefetch
host work    stages 2 and 3 partition gradients as backward produces them: a hook per
              parameter tensor every micro-step; stage 3 fetches and releases every module it
              gathers, host-side bookkeeping per module and pass
copies        partitioned stages copy gradients and parameters into and out of flat buffers
update        the optimizer over the rank's parameters (all at stage 0, a 1/N shard from stage 1
              on); offloaded, on the host, with gradients copied out and parameters back
============  =================================================================================

Torch-free: the tuner counts every configuration of its space.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from autotune.profiling.model_info import ModelInfo

# ZeRO-3 keeps a module's parameters whole on every rank, gathered once, below this many
# elements (DeepSpeed's stage3_param_persistence_threshold default, the built-in engine's).
DEFAULT_PERSISTENCE_THRESHOLD = 100_000


@dataclass(frozen=True)
class ModelShape:
    """What the model needs of the workload (see :class:`autotune.profiling.model_info.ModelInfo`).

    ``flops_per_sample`` counts forward and backward of one sample. The rest is 0 (or empty)
    where unknown, and its terms then count nothing.

    Attributes:
        num_params: parameters.
        flops_per_sample: FLOPs of forward and backward, per sample.
        num_param_tensors: parameter tensors (ZeRO-2 and -3 hook each one's gradient).
        module_param_counts: parameters each module holds itself (ZeRO-3's gather units).
        recompute_flops_per_sample: FLOPs activation checkpointing adds per sample.
    """

    num_params: int
    flops_per_sample: float
    num_param_tensors: int = 0
    module_param_counts: tuple[int, ...] = ()
    recompute_flops_per_sample: float = 0.0

    @classmethod
    def from_info(cls, info: ModelInfo) -> ModelShape:
        """The shape of a profiled workload."""
        return cls(
            num_params=info.num_params,
            flops_per_sample=info.flops_per_sample,
            num_param_tensors=info.num_param_tensors,
            module_param_counts=tuple(info.module_param_counts),
            recompute_flops_per_sample=info.recompute_flops_per_sample,
        )

    def gathered_modules(self, persistence_threshold: float | None) -> int:
        """Modules ZeRO-3 gathers one by one (those at or above the threshold)."""
        threshold = (
            DEFAULT_PERSISTENCE_THRESHOLD
            if persistence_threshold is None
            else persistence_threshold
        )
        return sum(1 for count in self.module_param_counts if count >= threshold)


@dataclass(frozen=True)
class Topology:
    """Where the ranks run: ``world_size`` data-parallel ranks (after model parallelism),
    ``ranks_per_node`` of them per node, training at ``precision``."""

    world_size: int
    ranks_per_node: int
    precision: str = "fp32"

    @property
    def num_nodes(self) -> int:
        return math.ceil(self.world_size / max(1, self.ranks_per_node))

    @property
    def spans_nodes(self) -> bool:
        return self.world_size > self.ranks_per_node

    @property
    def weight_bytes(self) -> int:
        """Bytes of a parameter or gradient as communicated."""
        return 4 if self.precision == "fp32" else 2


@dataclass(frozen=True)
class StepShape:
    """One configuration as the model sees it.

    Bucket sizes are in elements (None: unbounded, one bucket holds the model).
    """

    stage: int
    micro_batch_size: int
    accumulation: int = 1
    offload_optimizer: bool = False
    overlap_comm: bool = False
    reduce_scatter: bool = True
    reduce_bucket_size: float | None = None
    allgather_bucket_size: float | None = None
    prefetch_bucket_size: float | None = None
    activation_checkpointing: bool = False
    param_persistence_threshold: float | None = None


# The columns of a configuration's row (:func:`step_counts`), what the constants multiply.
COLUMNS = (
    "micro_steps",  # g
    "samples_flops",  # g·b·F
    "flops",  # g·F
    "micro_overlap_bytes",  # communicated every micro-step under that micro-step's compute
    "micro_overlap_calls",
    "boundary_overlap_bytes",  # communicated once a step, under the last micro-step's compute
    "boundary_overlap_calls",
    "exposed_bytes",  # communicated bytes nothing hides
    "exposed_calls",
    "copy_bytes",
    "update_params",
    "host_params",
    "host_bytes",
    "spans_nodes",  # 1 when collectives cross the network
    "hooked_tensors",  # gradient hooks run, g × parameter tensors at stages 2-3
    "module_fetches",  # g × modules gathered × passes at stage 3
)
COLUMN = {name: i for i, name in enumerate(COLUMNS)}


def step_counts(model: ModelShape, shape: StepShape, topology: Topology) -> list[float]:
    """The counts one optimizer step of ``shape`` incurs per rank (a row of :data:`COLUMNS`).

    Example:
        >>> model = ModelShape(num_params=1000, flops_per_sample=6e3)
        >>> shape = StepShape(stage=2, micro_batch_size=4, accumulation=2, overlap_comm=True)
        >>> row = dict(zip(COLUMNS, step_counts(model, shape, Topology(4, 4))))
        >>> row["exposed_bytes"], row["micro_overlap_bytes"]  # gather after the step; reduces
        (3000.0, 6000.0)
    """
    n, w = topology.world_size, topology.weight_bytes
    g, b, p = shape.accumulation, shape.micro_batch_size, model.num_params
    ring = (n - 1) / n * p * w if n > 1 else 0.0
    flops = model.flops_per_sample
    if shape.activation_checkpointing:
        flops += model.recompute_flops_per_sample

    def calls(bucket: float | None) -> float:
        if n <= 1:
            return 0.0
        return float(math.ceil(p / bucket)) if bucket and bucket < p else 1.0

    reduce_calls = calls(shape.reduce_bucket_size)
    gather_calls = calls(shape.allgather_bucket_size)
    micro_bytes = micro_calls = boundary_bytes = boundary_calls = 0.0
    exposed_bytes = exposed_calls = 0.0
    fetches = 0.0
    if shape.stage == 0:
        boundary_bytes, boundary_calls = 2 * ring, reduce_calls
    elif shape.stage == 1:
        volume = ring if shape.reduce_scatter else 2 * ring
        boundary_bytes, boundary_calls = volume, reduce_calls
        exposed_bytes, exposed_calls = ring, gather_calls
    elif shape.stage == 2:
        micro_bytes, micro_calls = g * ring, g * reduce_calls
        exposed_bytes, exposed_calls = ring, gather_calls
    else:  # stage 3: gathers for forward, backward (and the recompute), prefetched
        passes = 3 if shape.activation_checkpointing else 2
        modules = model.gathered_modules(shape.param_persistence_threshold)
        per_pass = float(modules) if modules else calls(shape.prefetch_bucket_size)
        # The hooks fetch and release every module even on one rank, where nothing moves.
        # Modules unknown (a shape from sizes alone): one unit a pass, a cost per micro-step.
        fetches = float(g * passes * (modules if model.module_param_counts else 1))
        micro_bytes = g * (passes + 1) * ring
        micro_calls = g * (passes * (per_pass if n > 1 else 0.0) + reduce_calls)
    if not shape.overlap_comm and shape.stage < 3:
        exposed_bytes += micro_bytes + boundary_bytes
        exposed_calls += micro_calls + boundary_calls
        micro_bytes = micro_calls = boundary_bytes = boundary_calls = 0.0
    copy_bytes = {0: 0.0, 1: 2.0, 2: g + 1.0, 3: 3.0 * g}[shape.stage] * p * w
    shard = p / n if shape.stage >= 1 else float(p)
    host = shard if shape.offload_optimizer else 0.0
    hooked = float(g * model.num_param_tensors) if shape.stage >= 2 else 0.0
    return [
        float(g),
        g * b * flops,
        g * flops,
        micro_bytes,
        micro_calls,
        boundary_bytes,
        boundary_calls,
        exposed_bytes,
        exposed_calls,
        copy_bytes,
        0.0 if shape.offload_optimizer else shard,
        host,
        host * (4 + w),
        1.0 if topology.spans_nodes else 0.0,
        hooked,
        fetches,
    ]


def rows_of(
    model: ModelShape, shapes: Sequence[StepShape], topology: Topology
) -> list[list[float]]:
    """:func:`step_counts` of each shape."""
    return [step_counts(model, shape, topology) for shape in shapes]
