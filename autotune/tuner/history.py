"""What a study says about a run, read from its trials: the one view every decision reads.

A :class:`History` is built from ``study.get_trials()`` (:meth:`History.from_trials`), never
told anything: each decision builds it afresh (or from a cache of trials it has seen), so that
any process that shares the study's storage decides alike, and a resumed run is the run it
interrupted. An experiment is a trial with a configuration (its parameters, as
:class:`~autotune.tuner.search_space.SearchSpace` reads them); it is in flight while its trial
runs, and finished once told, with a result (:func:`~autotune.tuner.trials.result_of`).

Experiments are taken in the order they were proposed (their trials' numbers; a trial that
runs again what a killed run left running takes the place of the one it replaces, see
:data:`~autotune.tuner.trials.PROPOSED_AS_ATTR`) and results in the order they were told
(their trials' completion).

Names (:class:`Entry`) are registered as the searches consider configurations: a cache of
the space's naming, built within one decision, not state that outlives it.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from autotune.config import Metric
from autotune.experiment import ExperimentResult
from autotune.tuner.naming import repeat_name
from autotune.tuner.ranking import Ranked, rank, score
from autotune.tuner.space import Variant

Knobs = tuple[tuple[str, Any], ...]


@dataclass(frozen=True)
class Entry:
    """A configuration, known by its name: a ZeRO variant at a micro-batch size with a value
    for each knob tuned at its stage, and the dotted-key overrides that make it of the
    user's config (those that differ from it).

    Attributes:
        own_knobs: every knob at the config's own value (a micro-batch run of the variant).
    """

    variant: Variant
    micro_batch_size: int
    knobs: Knobs
    overrides: Mapping[str, Any]
    own_knobs: bool = True


@dataclass(frozen=True)
class Experiment:
    """One experiment as its trial records it.

    Attributes:
        name: its name (a configuration's, or a re-measurement's: ``z1_mbs8_r1``).
        number: its place in the order experiments were proposed.
        entry: the configuration it measures.
        repeat_of: for a re-measurement, the configuration's name.
        result: how it ended (None: in flight).
        phase: the phase that proposed it, as the trial records it (None: not recorded).
        trial_number: its trial's own number.
    """

    name: str
    number: int
    entry: Entry
    repeat_of: str | None = None
    result: ExperimentResult | None = None
    phase: str | None = None
    trial_number: int = -1

    @property
    def config(self) -> str:
        """The configuration it measures."""
        return self.repeat_of or self.name


class History:
    """The experiments of a run (see the module docstring), with the views decisions read:
    those in flight (``pending``), finished (``results``, in ``order`` told), every one by
    number (``proposed``), and the configurations by name (``entries``).

    Args:
        experiments: every experiment, any order.
        told: the names of the finished ones in the order they were told (default: by
            number).
    """

    def __init__(self, experiments: Iterable[Experiment], told: Sequence[str] = ()) -> None:
        ordered = sorted(experiments, key=lambda e: e.number)
        self._experiments = {e.name: e for e in ordered}
        self._proposed = [e.name for e in ordered]
        self._entries: dict[str, Entry] = {}
        self._repeat_of: dict[str, str] = {}
        self._runs: dict[str, list[str]] = {}
        self._pending: dict[str, Experiment] = {}
        self._size_runs: dict[Variant, dict[int, ExperimentResult]] = {}
        for experiment in ordered:
            self._entries.setdefault(experiment.config, experiment.entry)
            if experiment.repeat_of is not None:
                self._repeat_of[experiment.name] = experiment.repeat_of
            self._runs.setdefault(experiment.config, []).append(experiment.name)
            if experiment.result is None:
                self._pending[experiment.name] = experiment
        finished = {e.name for e in ordered if e.result is not None}
        order = [name for name in told if name in finished]
        order += [name for name in self._proposed if name in finished and name not in order]
        self._order = order
        self._results = {name: self._result(name) for name in order}
        for name in order:
            experiment = self._experiments[name]
            if experiment.repeat_of is None and experiment.entry.own_knobs:
                runs = self._size_runs.setdefault(experiment.entry.variant, {})
                runs[experiment.entry.micro_batch_size] = self._results[name]

    def _result(self, name: str) -> ExperimentResult:
        result = self._experiments[name].result
        assert result is not None
        return result

    # --- the experiments ----------------------------------------------------------------------

    def experiment(self, name: str) -> Experiment | None:
        return self._experiments.get(name)

    def __iter__(self) -> Iterator[Experiment]:
        """Every experiment, by number."""
        return (self._experiments[name] for name in self._proposed)

    def __len__(self) -> int:
        return len(self._proposed)

    @property
    def pending(self) -> Mapping[str, Experiment]:
        """Experiments in flight (their trials running), by name."""
        return self._pending

    @property
    def results(self) -> Mapping[str, ExperimentResult]:
        """Experiments finished, by name, in the order they were told."""
        return self._results

    @property
    def order(self) -> Sequence[str]:
        """Names finished, in the order they were told."""
        return self._order

    @property
    def proposed(self) -> Sequence[str]:
        """Every experiment's name, by number: finished or in flight."""
        return self._proposed

    def is_free(self, name: str) -> bool:
        """Neither run nor in flight."""
        return name not in self._results and name not in self._pending

    # --- configurations -----------------------------------------------------------------------

    @property
    def entries(self) -> Mapping[str, Entry]:
        """Every configuration measured, in flight or considered so far, by name."""
        return self._entries

    def register(self, name: str, entry: Entry) -> None:
        """Know ``name`` as ``entry``'s configuration (the first registration stays)."""
        self._entries.setdefault(name, entry)

    def config_of(self, name: str) -> str:
        """The configuration experiment ``name`` measures: its own name, or for a
        re-measurement the configuration it measures again."""
        return self._repeat_of.get(name, name)

    def is_repeat(self, name: str) -> bool:
        """Whether experiment ``name`` measures a configuration again."""
        return name in self._repeat_of

    @property
    def repeat_of(self) -> Mapping[str, str]:
        """Every re-measurement → its configuration."""
        return self._repeat_of

    def runs_of_config(self, config: str) -> Sequence[str]:
        """The experiments of configuration ``config``: its first measurement, then its
        re-measurements, by number."""
        return self._runs.get(config, ())

    def next_repeat(self, config: str) -> str:
        """The name ``config``'s next re-measurement takes (numbered after every experiment
        of it so far), known from now on as one of ``config``'s."""
        name = repeat_name(config, len(self.runs_of_config(config)))
        self._repeat_of.setdefault(name, config)
        return name

    # --- what the results say -----------------------------------------------------------------

    def runs_of(self, variant: Variant) -> Mapping[int, ExperimentResult]:
        """``variant``'s micro-batch runs at the config's own knobs: size → result."""
        return self._size_runs.get(variant, {})

    def largest_fit(self, variant: Variant) -> int | None:
        """The largest micro-batch of ``variant`` that ran ok (None: none yet)."""
        return max((s for s, r in self.runs_of(variant).items() if r.ok), default=None)

    def ranked(self, results: Iterable[ExperimentResult], metric: Metric) -> list[Ranked]:
        """``results`` ranked on ``metric`` (re-measurements folded into their
        configuration)."""
        ranking = rank(results, metric, self._repeat_of)
        return [r for r in ranking if r.name in self._entries]

    def ranking(self, metric: Metric) -> list[Ranked]:
        """Every result ranked on ``metric``."""
        return self.ranked(self._results.values(), metric)

    def best_score(self, variant: Variant, metric: Metric) -> float | None:
        """The variant's best result so far (None before one ran ok)."""
        return max(
            (
                score(r.metrics, metric)
                for name, r in self._results.items()
                if r.ok
                and r.metrics
                and name in self._entries
                and self._entries[name].variant == variant
            ),
            default=None,
        )
