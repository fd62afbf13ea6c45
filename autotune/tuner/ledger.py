"""What the tuner has seen: every configuration it may propose, by name, and every result told.

The tuner's parts (the search for each variant's largest micro-batch, the bounds failures
set, re-measurement, the time budget) decide from this record; only the tuner writes to it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from autotune.config import Metric
from autotune.experiment import ExperimentResult
from autotune.tuner.candidate import Candidate
from autotune.tuner.naming import split_repeat
from autotune.tuner.ranking import Ranked, rank, score
from autotune.tuner.space import Variant


@dataclass(frozen=True)
class Entry:
    """A configuration the tuner may propose, known by its name."""

    variant: Variant
    micro_batch_size: int
    knobs: tuple[tuple[str, Any], ...]
    overrides: Mapping[str, Any]


class Ledger:
    """The configurations (``entries``), the experiments in flight (``pending``) and the
    results (``results``, told in ``order``)."""

    def __init__(self) -> None:
        self.entries: dict[str, Entry] = {}
        self.pending: dict[str, Candidate] = {}
        self.results: dict[str, ExperimentResult] = {}
        self.order: list[str] = []  # names in the order they were told
        # Micro-batch runs at the config's own knobs, per variant: size → result.
        self.size_runs: dict[Variant, dict[int, ExperimentResult]] = {}

    def record(self, result: ExperimentResult, entry: Entry | None) -> None:
        """Keep a result told, of ``entry``'s configuration (None: one the tuner never
        registered)."""
        self.results[result.name] = result
        self.order.append(result.name)
        if entry is not None and not entry.knobs:
            self.size_runs.setdefault(entry.variant, {})[entry.micro_batch_size] = result

    def runs_of(self, variant: Variant) -> Mapping[int, ExperimentResult]:
        """``variant``'s micro-batch runs at the config's own knobs: size → result."""
        return self.size_runs.get(variant, {})

    def largest_fit(self, variant: Variant) -> int | None:
        """The largest micro-batch of ``variant`` that ran ok (None: none yet)."""
        return max((s for s, r in self.runs_of(variant).items() if r.ok), default=None)

    def search_results(self) -> Iterable[str]:
        """Names told that are no re-measurement, in the order told."""
        return (n for n in self.order if split_repeat(n)[1] == 0)

    def ranked(self, results: Iterable[ExperimentResult], metric: Metric) -> list[Ranked]:
        """``results`` ranked on ``metric``, the configurations the tuner knows only."""
        return [r for r in rank(results, metric) if r.name in self.entries]

    def best_search_result(self, metric: Metric) -> str | None:
        """The best configuration the search measured (re-measurements left out)."""
        ranking = self.ranked((self.results[n] for n in self.search_results()), metric)
        return ranking[0].name if ranking else None

    def best_score(self, variant: Variant, metric: Metric) -> float | None:
        """The variant's best result so far, any phase (None before one ran ok)."""
        return max(
            (
                score(r.metrics, metric)
                for name, r in self.results.items()
                if r.ok
                and r.metrics
                and name in self.entries
                and self.entries[name].variant == variant
            ),
            default=None,
        )
