"""What the tuner has seen: every configuration it may propose, by name, and one record per
experiment of where it stands (:class:`Trial`), numbered in the order it was proposed. An
experiment measures one configuration: the first of its name, a re-measurement of the one it
was proposed, told or owed for (:meth:`Ledger.config_of`); nothing reads that from a name.

The ledger is the one owner of that state: the tuner's parts (the search for each variant's
largest micro-batch, the bounds failures set, re-measurement, the time budget) read it through
read-only views and change it only through its methods, as Optuna's storage owns its trials.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from autotune.config import Metric
from autotune.experiment import ExperimentResult
from autotune.tuner.candidate import Candidate
from autotune.tuner.naming import repeat_name
from autotune.tuner.ranking import Ranked, rank, score
from autotune.tuner.reasons import NotRunReason
from autotune.tuner.space import Variant


@dataclass(frozen=True)
class Entry:
    """A configuration the tuner may propose, known by its name."""

    variant: Variant
    micro_batch_size: int
    knobs: tuple[tuple[str, Any], ...]
    overrides: Mapping[str, Any]


class TrialState(str, enum.Enum):
    """Where an experiment stands; a name without a trial is open (nothing decided yet)."""

    proposed = "proposed"  # numbered, not running: an interrupted run's, owed a run
    running = "running"
    finished = "finished"  # with a result of any status
    not_run = "not_run"  # with the reason


@dataclass(frozen=True)
class Trial:
    """One experiment's record (a configuration's, or one of its re-measurements).

    Attributes:
        name: the experiment's name.
        state: where it stands.
        number: its place in the order experiments were proposed (None: never proposed).
        candidate: what was handed out to run it (while ``running``).
        result: what it measured (once ``finished``).
        reason: why it did not run (``not_run``).
        final: ``not_run`` for good (a config rule rejects it); else a later phase may
            still propose it (its own phase merely ended before it).
    """

    name: str
    state: TrialState
    number: int | None = None
    candidate: Candidate | None = None
    result: ExperimentResult | None = None
    reason: NotRunReason | None = None
    final: bool = False


class Ledger:
    """The configurations (``entries``) and one :class:`Trial` per experiment name, with
    read-only views of those running (``pending``), finished (``results``, told in ``order``)
    and numbered (``proposed``)."""

    def __init__(self) -> None:
        self._entries: dict[str, Entry] = {}
        self._trials: dict[str, Trial] = {}
        self._proposed: list[str] = []  # by number
        self._next_number = 0
        # Views of the trials kept as they change, since every decision reads them.
        self._pending: dict[str, Candidate] = {}
        self._results: dict[str, ExperimentResult] = {}
        self._order: list[str] = []  # names in the order they were told
        # Micro-batch runs at the config's own knobs, per variant: size → result.
        self._size_runs: dict[Variant, dict[int, ExperimentResult]] = {}
        self._ruled_out_variants: dict[str, NotRunReason] = {}
        self._repeat_of: dict[str, str] = {}  # a re-measurement → its configuration
        self._runs: dict[str, list[str]] = {}  # a configuration → its experiments, in order

    # --- reading ------------------------------------------------------------------------------

    @property
    def entries(self) -> Mapping[str, Entry]:
        return self._entries

    @property
    def pending(self) -> Mapping[str, Candidate]:
        """Experiments running now, by name."""
        return self._pending

    @property
    def results(self) -> Mapping[str, ExperimentResult]:
        """Experiments finished, by name."""
        return self._results

    @property
    def order(self) -> Sequence[str]:
        """Names finished, in the order they were told."""
        return self._order

    @property
    def proposed(self) -> Sequence[str]:
        """Every name proposed, by number: run, running or owed."""
        return self._proposed

    def config_of(self, name: str) -> str:
        """The configuration experiment ``name`` measures: its own name, or for a
        re-measurement the configuration it measures again."""
        return self._repeat_of.get(name, name)

    def is_repeat(self, name: str) -> bool:
        """Whether experiment ``name`` measures a configuration again."""
        return name in self._repeat_of

    @property
    def repeat_of(self) -> Mapping[str, str]:
        """Every re-measurement (proposed, told or owed) → its configuration."""
        return self._repeat_of

    def repeat(self, config: str, index: int) -> str:
        """The name of ``config``'s ``index``-th re-measurement (1-based), known from now on
        as one of ``config``'s experiments."""
        name = repeat_name(config, index)
        self._repeat_of.setdefault(name, config)
        return name

    def runs_of_config(self, config: str) -> Sequence[str]:
        """The experiments of configuration ``config`` proposed, told or owed so far: its
        first measurement, then its re-measurements, in that order."""
        return self._runs.get(config, ())

    def trial(self, name: str) -> Trial | None:
        """``name``'s record (None: nothing decided about it yet)."""
        return self._trials.get(name)

    def owed(self) -> Iterable[str]:
        """Names an interrupted run proposed and never finished, not running yet, by number."""
        return (n for n in self._proposed if self._trials[n].state is TrialState.proposed)

    def not_run(self) -> Iterable[Trial]:
        """The experiments decided against, in the order decided."""
        return (t for t in self._trials.values() if t.state is TrialState.not_run)

    @property
    def ruled_out_variants(self) -> Mapping[str, NotRunReason]:
        """Variant label → why none of its configurations runs."""
        return self._ruled_out_variants

    def is_free(self, name: str) -> bool:
        """Neither run nor in flight."""
        return name not in self._results and name not in self._pending

    def may_propose(self, name: str) -> bool:
        """Free, and no rule rejected it (one its phase did not reach may still run)."""
        trial = self._trials.get(name)
        return self.is_free(name) and not (trial is not None and trial.final)

    def is_undecided(self, name: str) -> bool:
        """Nothing decided about ``name`` yet: never proposed, run or ruled out."""
        trial = self._trials.get(name)
        return trial is None or trial.state is TrialState.proposed

    # --- writing ------------------------------------------------------------------------------

    def register(self, name: str, entry: Entry) -> None:
        """Know ``name`` as ``entry``'s configuration (the first registration stays)."""
        self._entries.setdefault(name, entry)

    def _belongs(self, name: str, repeat_of: str | None) -> None:
        """Experiment ``name`` measures ``repeat_of`` again (None: its own configuration,
        unless it is known as a re-measurement already)."""
        repeat_of = repeat_of or self._repeat_of.get(name)
        config = repeat_of or name
        if repeat_of is not None:
            self._repeat_of[name] = repeat_of
        runs = self._runs.setdefault(config, [])
        if name not in runs:
            runs.append(name)

    def propose(self, candidate: Candidate, number: int | None = None) -> Candidate:
        """``candidate`` is running; returned numbered: an owed one keeps its number, a new
        one takes ``number`` (its trial's; None: the next)."""
        self._belongs(candidate.name, candidate.repeat_of)
        trial = self._trials.get(candidate.name)
        known = trial.number if trial is not None else None
        number = known if known is not None else self._number(candidate.name, number)
        candidate = replace(candidate, number=number)
        self._trials[candidate.name] = Trial(
            candidate.name, TrialState.running, number, candidate=candidate
        )
        self._pending[candidate.name] = candidate
        return candidate

    def owe(self, name: str, number: int | None = None, repeat_of: str | None = None) -> bool:
        """An interrupted run proposed ``name`` (as ``number``, None: next; a re-measurement
        of ``repeat_of``) and never finished it: it waits to run. False (and nothing changes)
        where it was already proposed."""
        trial = self._trials.get(name)
        if trial is not None and trial.number is not None:
            return False
        self._belongs(name, repeat_of)
        self._trials[name] = Trial(name, TrialState.proposed, self._number(name, number))
        return True

    def record(
        self, result: ExperimentResult, number: int | None = None, repeat_of: str | None = None
    ) -> bool:
        """Keep a result told; one told from history (not running) keeps the ``number`` it
        was proposed as (None: the next), or its own if it was owed, and says which
        configuration it measured again (``repeat_of``). False (and nothing changes) where
        ``result.name`` was told before."""
        name = result.name
        if name in self._results:
            return False
        if name not in self._pending:
            self._belongs(name, repeat_of)
        trial = self._trials.get(name)
        known = trial.number if trial is not None else None
        number = known if known is not None else self._number(name, number)
        self._trials[name] = Trial(name, TrialState.finished, number, result=result)
        self._pending.pop(name, None)
        self._results[name] = result
        self._order.append(name)
        entry = self._entries.get(name)
        if entry is not None and not entry.knobs:
            self._size_runs.setdefault(entry.variant, {})[entry.micro_batch_size] = result
        return True

    def rule_out(self, name: str, reason: NotRunReason) -> None:
        """``name`` never runs: a rule rejects it."""
        trial = self._trials.get(name)
        number = trial.number if trial is not None else None
        self._trials[name] = Trial(name, TrialState.not_run, number, reason=reason, final=True)

    def leave_unreached(
        self, name: str, reason: NotRunReason, *, replace_reason: bool = False
    ) -> None:
        """``name``'s phase ended before it ran, for ``reason``; the first reason stays unless
        ``replace_reason``. A later phase may still propose it."""
        state = self._trials[name].state if name in self._trials else None
        keep = state is TrialState.not_run and not replace_reason
        if keep or state in (TrialState.running, TrialState.finished):
            return
        number = self._trials[name].number if name in self._trials else None
        self._trials[name] = Trial(name, TrialState.not_run, number, reason=reason)

    def rule_out_variant(
        self, label: str, reason: NotRunReason, *, replace_reason: bool = True
    ) -> None:
        """No configuration of the variant ``label`` runs, for ``reason``."""
        if replace_reason or label not in self._ruled_out_variants:
            self._ruled_out_variants[label] = reason

    def _number(self, name: str, number: int | None = None) -> int:
        """Number ``name``: as an earlier run did (history is told in its order, so numbers
        only grow; one already passed, of a log line written out of order, takes the next),
        else the next."""
        number = self._next_number if number is None else max(number, self._next_number)
        self._proposed.append(name)
        self._next_number = number + 1
        return number

    # --- what the results say -----------------------------------------------------------------

    def runs_of(self, variant: Variant) -> Mapping[int, ExperimentResult]:
        """``variant``'s micro-batch runs at the config's own knobs: size → result."""
        return self._size_runs.get(variant, {})

    def largest_fit(self, variant: Variant) -> int | None:
        """The largest micro-batch of ``variant`` that ran ok (None: none yet)."""
        return max((s for s, r in self.runs_of(variant).items() if r.ok), default=None)

    def ranked(self, results: Iterable[ExperimentResult], metric: Metric) -> list[Ranked]:
        """``results`` ranked on ``metric``, the configurations the tuner knows only."""
        ranking = rank(results, metric, self._repeat_of)
        return [r for r in ranking if r.name in self._entries]

    def best_score(self, variant: Variant, metric: Metric) -> float | None:
        """The variant's best result so far, any phase (None before one ran ok)."""
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
