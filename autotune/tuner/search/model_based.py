"""``model_based`` (the default): predict, then measure, in one phase (``model``).

Every configuration of the space is predicted with a cost model of the ZeRO step fitted to
what the run measured (:mod:`autotune.tuner.model_search`); the one with the largest expected
improvement over the best, times its chance to fit, is measured next; the search ends when no
configuration left could beat the best by more than the tolerance. Before the workload's size
is known (a script's), the memory search of :mod:`autotune.tuner.probe` runs instead; earlier
runs' answers (:class:`~autotune.tuner.warm_start.WarmStart`) are measured first.
"""

from __future__ import annotations

from collections.abc import Container, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from autotune.tuner.candidate import Phase
from autotune.tuner.cost_model import CostModel, ModelShape
from autotune.tuner.hardware import Hardware
from autotune.tuner.model_search import ModelSearch
from autotune.tuner.reasons import NotRunKind, NotRunReason, StopReason
from autotune.tuner.remeasure import CONTROL_AT_END
from autotune.tuner.search.base import Search, SearchContext, note_unsearched_variants
from autotune.tuner.warm_start import WarmStart

if TYPE_CHECKING:
    from autotune.profiling.model_info import ModelInfo
    from autotune.tuner.space import TuningSpace


class ModelBasedSearch(Search):
    """The cost model's search (see the module docstring).

    Args:
        context: the tuner's state.
        hardware: the datasheet the constants start from.
        ranks_per_node: ranks that share a node's links.
        model_info: the workload's sizes (None: not known yet).
        warm_start: what earlier runs on the same hardware taught.
    """

    phases = (Phase.model,)

    def __init__(
        self,
        context: SearchContext,
        hardware: Hardware,
        ranks_per_node: int,
        model_info: ModelInfo | None,
        warm_start: WarmStart | None = None,
    ) -> None:
        super().__init__(context)
        self.model = ModelSearch(
            context.config,
            context.catalog,
            context.ledger,
            context.bounds,
            hardware,
            ranks_per_node,
            model_shape(model_info),
            warm_start.prior() if warm_start is not None else None,
        )
        # Earlier runs' answers, measured first where the space holds them, each once.
        self._answers: list[Mapping[str, Any]] = (
            list(warm_start.answers) if warm_start is not None else []
        )

    def next(self, phase: Phase) -> str | None:
        """What an interrupted run had running, then earlier runs' answers, then the cost
        model's pick (before the workload's size is known, the next size of the memory
        search)."""
        context, search = self.context, self.model
        catalog, ledger = context.catalog, context.ledger
        for name in ledger.owed():
            key = search.key_of(name)
            if key is not None:
                catalog.register(*key)
                return name
            if name in catalog.size_names:
                catalog.register_size_run(name)
                return name
        if context.stopping.patience_spent(phase, search):
            return None
        if (answer := self._next_answer()) is not None:
            return answer
        if search.fitted() is None:
            return context.sizes.next()
        ranking = ledger.ranked(ledger.results.values(), context.config.autotuning.metric)
        chosen = search.next(ranking[0] if ranking else None)
        if chosen is None and ledger.pending:
            return None  # what is in flight may still change the model's mind
        if chosen is None:
            # Nothing beats the best on its one measurement, perhaps a lucky one: the control
            # first if it is due (the noise it shows decides the rest), then the best again
            # if a second measurement could change the answer; the model then decides again.
            remeasure = context.remeasure
            return remeasure.control_due(
                ledger.is_undecided, every=CONTROL_AT_END
            ) or remeasure.confirmation(ledger.is_undecided)
        key = search.key_of(chosen)
        assert key is not None
        catalog.register(*key)
        return chosen

    def _next_answer(self) -> str | None:
        """The next earlier answer this space holds and that may run."""
        catalog = self.context.catalog
        space = catalog.space
        while self._answers:
            answer = self._answers.pop(0)
            name = space.name({**space.fixed, **answer})
            key = self.model.key_of(name)
            if key is not None and catalog.is_open(catalog.register(*key)):
                return name
        return None

    def patience(self, phase: Phase) -> Container[str] | None:
        return self.model

    def end(self, phase: Phase) -> None:
        note_unsearched_variants(self.context)

    def not_measured(self, stop: StopReason | None) -> dict[str, NotRunReason]:
        """One line per variant: the configurations the model says cannot beat the best."""
        return {
            f"{label}: {count} configurations": NotRunReason(NotRunKind.not_measured, stop=stop)
            for label, count in self.model.unmeasured().items()
        }

    def known(self, name: str) -> None:
        """A configuration the cost model proposed, told from history, known by its key."""
        if name not in self.context.ledger.entries:
            key = self.model.key_of(name)
            if key is not None:
                self.context.catalog.register(*key)

    def learn_model(self, space: TuningSpace, model_info: ModelInfo) -> None:
        self.model.use_space(space, model_shape(model_info))

    def fitted(self) -> CostModel | None:
        return self.model.fitted()

    def predicted(self, names: Sequence[str]) -> dict[str, float]:
        return self.model.predicted(names)


def model_shape(model_info: ModelInfo | None) -> ModelShape | None:
    """What the cost model needs of the workload (None: not known yet): its size and FLOPs,
    its parameter tensors (stages 2-3 hook each) and modules (stage 3 gathers each), and what
    checkpointing recomputes."""
    if model_info is None or model_info.flops_per_sample <= 0:
        return None
    return ModelShape.from_info(model_info)
