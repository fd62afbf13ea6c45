"""What every search shares: the tuner's state it reads (:class:`SearchContext`) and the
interface the tuner drives it through (:class:`Search`), which is also Optuna's
``BaseSampler``: a search is the sampler of the run's study.

The tuner asks the search for the next configuration of its phase (:meth:`Search.next`),
makes the experiment, then asks the study for its trial: Optuna calls the study's sampler,
the search, whose relative sampling hands it that configuration's parameters
(:meth:`Search.propose` set them). A search decides from the whole run's state (every trial,
the bounds failures set, what is in flight), which it reads from the tuner rather than
rebuilding it from the study at each ask; re-measurements and experiments an interrupted run
left are the tuner's, asked with fixed parameters.
"""

from __future__ import annotations

from collections.abc import Container, Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import optuna

from autotune.config import Config
from autotune.experiment import ExperimentResult
from autotune.tuner.bounds import Bounds
from autotune.tuner.candidate import Phase
from autotune.tuner.catalog import Catalog
from autotune.tuner.ledger import Ledger
from autotune.tuner.probe import SizeSearch
from autotune.tuner.reasons import NotRunKind, NotRunReason, StopReason
from autotune.tuner.remeasure import Remeasurement
from autotune.tuner.stopping import Stopping

if TYPE_CHECKING:
    from optuna.distributions import BaseDistribution
    from optuna.study import Study
    from optuna.trial import FrozenTrial

    from autotune.profiling.model_info import ModelInfo
    from autotune.tuner.space import TuningSpace


@dataclass(frozen=True)
class SearchContext:
    """The tuner's state a search reads (and registers configurations in).

    Attributes:
        config: the user's config.
        ledger: what the tuner has seen.
        catalog: the configurations by name.
        bounds: what failures prune.
        remeasure: re-measurement (the control, the leader's confirmation).
        stopping: when the search ends (early stopping, the trial cap).
        sizes: the search for each variant's largest micro-batch.
    """

    config: Config
    ledger: Ledger
    catalog: Catalog
    bounds: Bounds
    remeasure: Remeasurement
    stopping: Stopping
    sizes: SizeSearch


class Search(optuna.samplers.BaseSampler):
    """A tuner type's search: its phases and, in each, the next configuration to measure;
    and, as the study's sampler, the trial's parameters of the one proposed.

    Subclasses say what :attr:`phases` they search in and implement :meth:`next`.
    """

    phases: tuple[Phase, ...] = ()

    def __init__(self, context: SearchContext) -> None:
        self.context = context
        self._proposal: tuple[dict[str, Any], dict[str, BaseDistribution]] | None = None

    # --- the tuner's side ---------------------------------------------------------------------

    def begin(self, phase: Phase) -> None:
        """``phase`` starts (the one before it ended)."""

    def next(self, phase: Phase) -> str | None:
        """The configuration ``phase`` wants measured next; None: nothing now (waiting for a
        result in flight, or nothing left)."""
        raise NotImplementedError

    def patience(self, phase: Phase) -> Container[str] | None:
        """The configurations of ``phase`` early stopping counts (None: it does not apply)."""
        return None

    def points(self, phase: Phase) -> Iterable[str]:
        """The configurations ``phase`` considered that may still run: those left unrun when
        it ends are noted as not reached."""
        return ()

    def tell(self, result: ExperimentResult) -> None:
        """A result came in (any experiment's)."""

    def drop(self, name: str) -> None:
        """``name`` will never run (a rule rejects it, or the time left is too short)."""

    def end(self, phase: Phase) -> None:
        """``phase`` ended."""

    def not_measured(self, stop: StopReason | None) -> dict[str, NotRunReason]:
        """What the search, once over, left unmeasured and why (beyond what the ledger says)."""
        return {}

    def learn_model(self, space: TuningSpace, model_info: ModelInfo) -> None:
        """The workload's size is known now (a script's, measured): ``space`` is searched."""

    # --- Optuna's side ------------------------------------------------------------------------

    def propose(self, params: Mapping[str, Any], distributions: Mapping[str, Any]) -> None:
        """The next trial the study asks is the configuration with ``params``."""
        self._proposal = (dict(params), dict(distributions))

    def infer_relative_search_space(
        self, study: Study, trial: FrozenTrial
    ) -> dict[str, BaseDistribution]:
        return dict(self._proposal[1]) if self._proposal is not None else {}

    def sample_relative(
        self, study: Study, trial: FrozenTrial, search_space: dict[str, BaseDistribution]
    ) -> dict[str, Any]:
        if self._proposal is None:
            return {}
        params, self._proposal = self._proposal[0], None
        return {name: value for name, value in params.items() if name in search_space}

    def sample_independent(
        self,
        study: Study,
        trial: FrozenTrial,
        param_name: str,
        param_distribution: BaseDistribution,
    ) -> Any:
        raise RuntimeError(
            f"{type(self).__name__} samples the configuration the tuner proposed, and "
            f"{param_name!r} is not part of it: ask trials of this study through its Tuner"
        )


def note_unsearched_variants(context: SearchContext) -> None:
    """Why each variant with nothing that ran ok has none: never run is not the same as
    nothing fits (the trial cap or the time budget can end the search before it)."""
    ledger, metric = context.ledger, context.config.autotuning.metric
    ran = {entry.variant for name, entry in ledger.entries.items() if name in ledger.results}
    for plan in context.catalog.space.plans:
        if ledger.best_score(plan.variant, metric) is not None:
            continue
        kind = NotRunKind.none_fit if plan.variant in ran else NotRunKind.not_searched
        ledger.rule_out_variant(plan.variant.label, NotRunReason(kind), replace_reason=False)
