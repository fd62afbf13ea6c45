"""``autotune plan``: the predicted ranking of a search space on hardware not at hand.

Nothing runs. Every configuration ``autotune run`` would consider (each ZeRO variant's
micro-batch sizes, and its knob points where the config searches them) is predicted by the
cost model (:mod:`autotune.tuner.cost_model`), from a datasheet's figures
(:mod:`autotune.tuner.hardware`) or from the constants a finished run fitted, and by the
memory estimate (:mod:`autotune.tuner.memory`) against the device's memory. A prediction is
a guess: a measurement always outranks it, and ``autotune run`` measures.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from autotune.config import Config
from autotune.tuner.cost_model import CostModel, ModelShape, Topology, prior_for, step_counts
from autotune.tuner.hardware import Hardware
from autotune.tuner.memory import estimate_memory
from autotune.tuner.model_search import step_shape
from autotune.tuner.space import Variant, build_space, micro_batch_sizes

if TYPE_CHECKING:
    from autotune.profiling.model_info import ModelInfo

# The interval each prediction carries: 80%, two-sided.
INTERVAL_Z = 1.28


@dataclass(frozen=True)
class PlannedConfig:
    """One configuration's prediction.

    Attributes:
        name: as ``autotune run`` names it (``z1_mbs8``).
        zero_stage: the ZeRO stage.
        micro_batch_size: per GPU.
        gradient_accumulation_steps: per optimizer step.
        offload: where the optimizer lives (``none`` or ``cpu``).
        throughput: predicted global samples per second, with its 80% interval
            (``throughput_low``, ``throughput_high``).
        latency: predicted seconds per optimizer step.
        tflops_per_gpu: predicted model TFLOP/s per GPU (forward and backward).
        memory_bytes: estimated peak memory per GPU.
        fits: whether that fits in the device's memory (with the estimate's margin).
        over_bytes: how far the estimate is over the memory it may use (the device's less
            the margin); 0 where it fits.
        knobs: other keys this configuration sets (dotted keys).
        activation_checkpointing: whether the model recomputes its activations in backward.
    """

    name: str
    zero_stage: int
    micro_batch_size: int
    gradient_accumulation_steps: int
    offload: str
    throughput: float
    throughput_low: float
    throughput_high: float
    latency: float
    tflops_per_gpu: float
    memory_bytes: int
    fits: bool
    knobs: Mapping[str, Any] = field(default_factory=dict)
    activation_checkpointing: bool = False
    over_bytes: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "zero_stage": self.zero_stage,
            "micro_batch_size": self.micro_batch_size,
            "gradient_accumulation_steps": self.gradient_accumulation_steps,
            "offload": self.offload,
            "throughput": self.throughput,
            "throughput_low": self.throughput_low,
            "throughput_high": self.throughput_high,
            "latency": self.latency,
            "tflops_per_gpu": self.tflops_per_gpu,
            "memory_bytes": self.memory_bytes,
            "fits": self.fits,
            "over_bytes": self.over_bytes,
            "knobs": dict(self.knobs),
            "activation_checkpointing": self.activation_checkpointing,
        }


def plan(
    config: Config,
    model_info: ModelInfo,
    hardware: Hardware,
    ranks_per_node: int,
    cost_model: CostModel | None = None,
) -> list[PlannedConfig]:
    """Every configuration of ``config``'s search space on ``hardware`` that fits, and the
    first micro-batch that does not in each variant, best first: those that fit, by the
    config's metric, then those that do not (least memory first).

    Args:
        config: the config, its world size the GPUs planned for.
        model_info: the model's size, FLOPs and activations.
        hardware: the GPU (its memory bounds what fits; its datasheet seeds the constants).
        ranks_per_node: GPUs per node.
        cost_model: constants a run fitted (``--from``); None: the datasheet's.

    Example:
        >>> from autotune.config import load_config
        >>> from autotune.profiling.model_info import ModelInfo
        >>> from autotune.tuner.hardware import CATALOG
        >>> info = ModelInfo(num_params=10**8, param_bytes=2 * 10**8,
        ...                  activation_bytes_per_sample=10**9, flops_per_sample=6e11)
        >>> config = load_config({"fp16": {"enabled": True},
        ...                       "autotuning": {"max_train_micro_batch_size_per_gpu": 64}}, 8)
        >>> best = plan(config, info, CATALOG["a100-80gb"], ranks_per_node=8)[0]
        >>> best.fits, best.micro_batch_size > 32
        (True, True)
    """
    budget = hardware.memory_bytes
    space = build_space(config, model_info, budget)
    data_parallel = max(1, config.world_size // config.autotuning.mp_size)
    topology = Topology(data_parallel, min(ranks_per_node, data_parallel), config.precision)
    model = cost_model or CostModel.from_prior(prior_for(hardware, topology))
    shape = ModelShape.from_info(model_info)
    listed = micro_batch_sizes(config)[1]
    rows: list[PlannedConfig] = []
    for plan_ in space.plans:
        dims = [key for key, _ in plan_.knobs]
        for point in itertools.product(*(values for _, values in plan_.knobs)):
            knobs = dict(zip(dims, point, strict=True))
            values = {**space.base, **knobs}
            rows += _predict(
                config,
                space.name,
                space.overrides,
                plan_.variant,
                plan_.ladder if listed else _sizes(plan_.ladder, plan_.estimate),
                values,
                knobs,
                model,
                shape,
                topology,
                plan_.estimate,
            )
    # Variants whose model states do not fit even at the smallest size: rows that say so,
    # at every size the config lists (else at the smallest it allows).
    for variant in _pruned_variants(space.pruned):
        estimate = estimate_memory(
            model_info,
            config,
            variant.stage,
            variant.offload_optimizer,
            budget,
            activation_checkpointing=variant.activation_checkpointing,
        )
        if replace(estimate, buffer_bytes=0).fits(space.sizes[0]):
            continue  # pruned by a config rule, not by memory: nothing to predict
        rows += _predict(
            config,
            space.name,
            space.overrides,
            variant,
            space.sizes if listed else space.sizes[:1],
            dict(space.base),
            {},
            model,
            shape,
            topology,
            estimate,
        )
    lower = config.autotuning.metric.lower_is_better
    return sorted(
        rows,
        key=lambda r: (
            not r.fits,
            r.memory_bytes if not r.fits else 0,
            r.latency if lower else -r.throughput,
            r.memory_bytes,
            r.name,
        ),
    )


def _pruned_variants(pruned: Mapping[str, str]) -> list[Variant]:
    """The variants ``build_space`` pruned (its ``pruned`` is keyed by their labels)."""
    every = (
        Variant(stage, offload, checkpointed)
        for stage in range(4)
        for offload in (False, True)
        for checkpointed in (False, True)
    )
    return [variant for variant in every if variant.label in pruned]


def _sizes(ladder: tuple[int, ...], estimate: Any) -> list[int]:
    """The sizes worth listing: every one that fits, and the first that does not (where
    memory ends); a list of a thousand sizes that cannot run says nothing more."""
    if estimate is None:
        return list(ladder)
    fitting = [size for size in ladder if estimate.fits(size)]
    beyond = [size for size in ladder if not estimate.fits(size)]
    return fitting + beyond[:1]


def _predict(
    config: Config,
    name_of: Any,
    overrides_of: Any,
    variant: Variant,
    sizes: Iterable[int],
    values: dict[str, Any],
    knobs: Mapping[str, Any],
    model: CostModel,
    shape: ModelShape,
    topology: Topology,
    estimate: Any,
) -> list[PlannedConfig]:
    sizes = list(sizes)
    shapes = [step_shape(config, values, variant, size) for size in sizes]
    predictions = model.predict(
        [step_counts(shape, s, topology) for s in shapes], [variant.label] * len(shapes)
    )
    rows = []
    for size, step, prediction in zip(sizes, shapes, predictions, strict=True):
        samples = size * step.accumulation * topology.world_size
        latency = prediction.latency_s
        spread = math.exp(INTERVAL_Z * prediction.sd)
        overrides = overrides_of(variant, size, dict(knobs))
        memory = estimate.bytes_at(size) if estimate is not None else 0
        fits = estimate.fits(size) if estimate is not None else True
        rows.append(
            PlannedConfig(
                name=name_of(overrides),
                zero_stage=variant.stage,
                micro_batch_size=size,
                gradient_accumulation_steps=step.accumulation,
                offload="cpu" if variant.offload_optimizer else "none",
                throughput=samples / latency,
                throughput_low=samples / latency / spread,
                throughput_high=samples / latency * spread,
                latency=latency,
                tflops_per_gpu=shape.flops_per_sample * size * step.accumulation / latency / 1e12,
                memory_bytes=int(memory),
                fits=fits,
                knobs=dict(knobs),
                activation_checkpointing=variant.activation_checkpointing,
                over_bytes=0 if fits else int(memory - estimate.usable_bytes),
            )
        )
    return rows
