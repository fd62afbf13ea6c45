"""What the tuner expects of a variant before running it: a prior from the ZeRO models.

Per optimizer step a rank computes ``micro_batch × FLOPs per sample``, updates its share of
the parameters (all of them at stage 0, a 1/N shard from stage 1 on: ZeRO's point) and
communicates a volume set by its stage: stages 0-2 all-reduce (or reduce-scatter and
all-gather) the gradients and parameters once, about 2 × the model's bytes; stage 3 also
gathers the parameters again for backward, about 3 ×; an offloaded optimizer adds a host step
over the model's states and its copies in and out. The update is charged whole at every stage:
what sharding saves of it, the partitioned stages spend again on their flat-buffer copies and
the extra collective launches (measured on the committed landscapes, stages 0-2 run within
noise of each other at equal micro-batch). So at equal micro-batch the lower stage is never
predicted slower, and variants that tie keep stage order: a higher stage must fit a larger
micro-batch to come first, as in DeepSpeed's own autotuner, which climbs the stages only
while that pays. The ratio of compute speed to bandwidth is not known before running, so the
prior takes a typical one; it only orders the variants (which to search first), so it need
not be exact. Once sizes are measured, the prior that a larger micro-batch amortizes more
decides close calls between them (:func:`best_micro_batch`).
"""

from __future__ import annotations

import random
from collections.abc import Iterable
from typing import TYPE_CHECKING

from autotune.config import AutotuningConfig, Metric, TunerType
from autotune.tuner.history import History
from autotune.tuner.ranking import rank

if TYPE_CHECKING:
    from autotune.profiling.model_info import ModelInfo
    from autotune.tuner.space import VariantPlan

# FLOPs a rank computes in the time it moves one byte to its peers.
FLOPS_PER_COMMUNICATED_BYTE = 64.0
# Communicated volume per step, as a multiple of the model's parameter bytes.
STAGE_COMMUNICATION = {0: 2.0, 1: 2.0, 2: 2.0, 3: 3.0}
# An offloaded optimizer step: the states are moved and updated on the host.
OFFLOAD_COMMUNICATION = 4.0
# An Adam-like update: a dozen or so FLOPs per parameter.
OPTIMIZER_FLOPS_PER_PARAM = 16.0

# How far behind the best a variant's result may be and still count as a contender: above
# this machine's run-to-run noise between medians, below the gaps the memory budget makes
# between stages.
DEFER_BEHIND = 0.2


def predicted_throughput(plan: VariantPlan, model_info: ModelInfo | None) -> float:
    """Samples per unit of time expected of ``plan`` at its estimated largest micro-batch.

    Without a model profile only the micro-batch where the search starts is known, and a
    larger one is taken as faster.

    Example:
        >>> from autotune.tuner.space import Variant, VariantPlan
        >>> small = VariantPlan(Variant(0), (1, 2, 4), 1, 3, ())
        >>> large = VariantPlan(Variant(3), (1, 2, 4), 4, 3, ())
        >>> predicted_throughput(large, None) > predicted_throughput(small, None)
        True
    """
    micro_batch = plan.start
    if plan.estimate is not None:
        micro_batch = max(1, plan.estimate.max_micro_batch_size(plan.ladder[-1]))
        micro_batch = min(micro_batch, plan.ladder[-1])
    if model_info is None or model_info.flops_per_sample <= 0:
        return float(micro_batch)
    volume = STAGE_COMMUNICATION[plan.variant.stage]
    if plan.variant.offload_optimizer:
        volume += OFFLOAD_COMMUNICATION
    communication_flops = volume * model_info.param_bytes * FLOPS_PER_COMMUNICATED_BYTE
    update_flops = OPTIMIZER_FLOPS_PER_PARAM * model_info.num_params
    step = micro_batch * model_info.flops_per_sample + communication_flops + update_flops
    return micro_batch / step


def variant_order(
    plans: Iterable[VariantPlan],
    tuner_type: TunerType | str,
    seed: int,
    model_info: ModelInfo | None = None,
) -> list[VariantPlan]:
    """The order in which variants get their largest micro-batch searched.

    gridsearch: stage order. random: a seeded shuffle. model_based: the most promising first,
    by :func:`autotune.tuner.prior.predicted_throughput`; once any variant's largest fit is
    known the micro-batch and knob phases follow in every variant anyway, so the order decides
    how soon a good configuration runs, not what is found.
    """
    plans = list(plans)
    kind = TunerType(tuner_type)
    if kind is TunerType.random:
        random.Random(seed).shuffle(plans)
    elif kind is TunerType.model_based:
        plans.sort(key=lambda plan: -predicted_throughput(plan, model_info))
    return plans


def largest_micro_batch_stands(largest: float, best: float, metric: Metric) -> bool:
    """Whether a variant's largest fit, measuring ``largest``, stays its micro-batch though a
    smaller one measured ``best`` (metric values, in the metric's own direction): the prior
    that a larger micro-batch amortizes the step's fixed costs holds unless the smaller one
    won by more than :data:`DEFER_BEHIND`, this machine's noise."""
    if metric.lower_is_better:
        return largest * (1 - DEFER_BEHIND) <= best
    return largest >= (1 - DEFER_BEHIND) * best


def best_micro_batch(plan: VariantPlan, history: History, tuning: AutotuningConfig) -> int | None:
    """The best of the sizes the micro-batch phase compared for ``plan``'s variant (not of
    the memory search's); with ``model_based``, the largest fit unless a smaller size beat it
    by more than the noise (:func:`largest_micro_batch_stands`)."""
    largest = history.largest_fit(plan.variant)
    if largest is None:
        return None
    runs = history.runs_of(plan.variant)
    compared = [runs[s] for s in plan.compared_sizes(largest) if s in runs]
    metric = tuning.metric
    ranking = rank(compared, metric)
    if not ranking:
        return None
    best = history.entries[ranking[0].name].micro_batch_size
    if TunerType(tuning.tuner_type) is TunerType.model_based:
        # The ZeRO model's prior: a larger micro-batch amortizes the step's fixed costs, so
        # the largest fit stands unless a smaller one beat it by more than the noise.
        at_largest = next((r for r in ranking if r.name == runs[largest].name), None)
        if at_largest is not None and largest_micro_batch_stands(
            at_largest.value, ranking[0].value, metric
        ):
            return largest
    return best
