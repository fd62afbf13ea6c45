"""``model_based`` (the default): predict, then measure, in one phase (``model``).

Every configuration of the space is predicted with a cost model of the ZeRO step fitted to
what the run measured (:mod:`autotune.tuner.model_search`); the one with the largest expected
improvement over the best, times its chance to fit, is measured next; the search ends when no
configuration left could beat the best by more than the tolerance. Before the workload's size
is known (a script's), the memory search of :mod:`autotune.tuner.probe` runs instead; earlier
runs' answers (:class:`~autotune.tuner.warm_start.WarmStart`) are measured first.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from autotune.config import TunerType
from autotune.tuner.candidate import Decision, DecisionKind, Phase
from autotune.tuner.cost_model import ModelShape, Prior, Topology, prior_for
from autotune.tuner.hardware import CPU_RANK, Hardware
from autotune.tuner.model_search import ModelSearch, SpaceIndex
from autotune.tuner.model_search.scored import FitCache
from autotune.tuner.search.base import Search, SearchContext
from autotune.tuner.warm_start import WarmStart

if TYPE_CHECKING:
    from autotune.profiling.model_info import ModelInfo
    from autotune.tuner.space import TuningSpace


class ModelBasedSearch(Search):
    """The cost model's search (see the module docstring).

    Args:
        hardware: the datasheet the constants start from (default: CPU ranks).
        ranks_per_node: ranks that share a node's links (default: all of them).
        warm_start: what earlier runs on the same hardware taught: their fitted constants
            as the prior, their answers measured first.
    """

    phases = (Phase.model,)
    tuner_type = TunerType.model_based

    def __init__(
        self,
        hardware: Hardware | None = None,
        ranks_per_node: int | None = None,
        warm_start: WarmStart | None = None,
    ) -> None:
        self.hardware = hardware or CPU_RANK
        self.ranks_per_node = ranks_per_node
        self._prior: Prior | None = warm_start.prior() if warm_start is not None else None
        self._answers: tuple[Mapping[str, Any], ...] = (
            warm_start.answers if warm_start is not None else ()
        )
        self._indices: dict[Any, SpaceIndex] = {}  # by the model's sizes the space has
        self._fits = FitCache()

    def decide(self, context: SearchContext) -> Decision:
        search = self.model_search(context)
        phase = Phase.model
        name, confirm = self._next(context, search)
        if name is not None:
            context.trace.current = (phase, ())
            return Decision.propose(context.history.entries[name], name, phase)
        if context.history.pending:
            context.trace.current = (phase, ())
            return Decision(DecisionKind.wait, phase)
        context.trace.end(phase, (), context.stopping.phase_end(phase, search))
        context.note_unsearched_variants()
        return Decision(
            DecisionKind.end, phase, stop=context.trace.stopped(), confirm_leader=confirm
        )

    def _next(self, context: SearchContext, search: ModelSearch) -> tuple[str | None, bool]:
        """The next configuration: earlier runs' answers, then the cost model's pick (before
        the workload's size is known, the next size of the memory search); and, where none,
        whether the model found nothing that could beat the leader as measured."""
        history, catalog = context.history, context.catalog
        if context.stopping.patience_spent(Phase.model, search):
            return None, False
        if (answer := self._next_answer(context, search)) is not None:
            return answer, False
        if search.fitted() is None:
            return context.sizes.next(), False
        ranking = history.ranking(context.tuning.metric)
        while (chosen := search.next(ranking[0] if ranking else None)) is not None:
            key = search.key_of(chosen)
            assert key is not None
            catalog.register(*key)  # known from now on: one that breaks a rule is excluded
            if catalog.breaks_rule(chosen) is None:
                return chosen, False
        return None, True

    def _next_answer(self, context: SearchContext, search: ModelSearch) -> str | None:
        """The first earlier answer this space holds that may run."""
        catalog, space = context.catalog, context.space
        for answer in self._answers:
            key = search.key_of(space.name({**space.fixed, **answer}))
            if key is not None and catalog.is_open(name := catalog.register(*key)):
                return name
        return None

    def model_search(self, context: SearchContext) -> ModelSearch:
        """The cost model's search on ``context`` (its index built once per space)."""
        config = context.search.config
        data_parallel = max(1, config.world_size // config.autotuning.mp_size)
        ranks_per_node = self.ranks_per_node or config.world_size
        topology = Topology(data_parallel, min(ranks_per_node, data_parallel), config.precision)
        model = model_shape(context.model_info)
        index = self._index(context, context.space, model, topology)
        return ModelSearch(
            config,
            index,
            context.history,
            context.bounds,
            topology,
            self._prior or prior_for(self.hardware, topology),
            model,
            self._fits,
            excluded=_Rejected(context),
            ruled_out=context.trace.variants,
        )

    def _index(
        self,
        context: SearchContext,
        space: TuningSpace,
        model: ModelShape | None,
        topology: Topology,
    ) -> SpaceIndex:
        key = context.model_info  # the space searched follows the model's sizes alone
        if key not in self._indices:
            self._indices[key] = SpaceIndex.build(
                context.search.config, context.search, space, model, topology
            )
        return self._indices[key]

    def not_measured(self, context: SearchContext) -> dict[str, int]:
        """Per variant, the configurations the model left unmeasured (it says they cannot
        beat the best)."""
        return self.model_search(context).unmeasured()


class _Rejected:
    """The configurations the model may not measure: those that break a config rule."""

    def __init__(self, context: SearchContext) -> None:
        self._catalog = context.catalog

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and self._catalog.breaks_rule(name) is not None


def model_shape(model_info: ModelInfo | None) -> ModelShape | None:
    """What the cost model needs of the workload (None: not known yet): its size and FLOPs,
    its parameter tensors (stages 2-3 hook each) and modules (stage 3 gathers each), and what
    checkpointing recomputes."""
    if model_info is None or model_info.flops_per_sample <= 0:
        return None
    return ModelShape.from_info(model_info)
