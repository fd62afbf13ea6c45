"""Why the search stopped and why a configuration did not run, as data: a kind and its
details. The words are the rendering layer's (:mod:`autotune.summary_text`), written once
there; summaries group and compare reasons by kind, never by their text."""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

Detail = int | float | str


class StopKind(str, enum.Enum):
    """Why the search (a phase of it, or the whole run) ended; the details each carries."""

    trial_cap = "trial_cap"  # tuner_num_trials
    no_better = "no_better"  # tuner_early_stopping
    model_converged = "model_converged"  # the tolerance
    exhausted = "exhausted"  # ()
    time_budget = "time_budget"  # time_budget_s: the next experiment would not end in it
    time_budget_kept = "time_budget_kept"  # time_budget_s: the rest kept for re-measuring
    time_budget_spent = "time_budget_spent"  # time_budget_s
    same_failure = "same_failure"  # how many failed, the error
    step_limit = "step_limit"  # the script's steps, end_profile_step


@dataclass(frozen=True)
class StopReason:
    """Why the search ended: ``kind``, with the values that say which limit (``details``)."""

    kind: StopKind
    details: tuple[Detail, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        """As a study's user attribute keeps it (JSON)."""
        return {"kind": self.kind.value, "details": list(self.details)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> StopReason:
        return cls(StopKind(data["kind"]), tuple(data.get("details") or ()))


class NotRunKind(str, enum.Enum):
    """Why a configuration (or a whole variant, or a range of micro-batches) did not run."""

    variant_rule = "variant_rule"  # the memory estimate or a config rule, explained
    config_rule = "config_rule"  # the config error
    oom_below = "oom_below"  # the experiment that ran out of memory at a smaller size
    out_of_data = "out_of_data"  # micro-batch, the run: every variant at or above it
    data_bound = "data_bound"  # micro-batch, the run: this configuration
    failed_sizes = "failed_sizes"  # how many failed, the largest fit, the sizes that failed
    time_budget = "time_budget"  # (with the stop) the next experiment would not end in time
    not_reached = "not_reached"  # (with the stop, if a limit ended the phase)
    search_ended = "search_ended"  # (with the run's stop) the search ended first
    not_searched = "not_searched"  # a variant the search ended before
    none_fit = "none_fit"  # a variant none of whose micro-batches ran ok
    not_measured = "not_measured"  # (with the stop) model_based: configurations left


@dataclass(frozen=True)
class NotRunReason:
    """Why something did not run: ``kind``, its ``details``, and the stop that left it
    unrun where a stop did."""

    kind: NotRunKind
    details: tuple[Detail, ...] = ()
    stop: StopReason | None = None


class UnrunKind(str, enum.Enum):
    """What an entry of "not run" stands for."""

    configuration = "configuration"  # one configuration, by name
    variant = "variant"  # every configuration of a ZeRO variant, by label
    sizes_above = "sizes_above"  # a variant's micro-batches above ``size``
    sizes_from = "sizes_from"  # every variant's micro-batches from ``size`` up
    unmeasured = "unmeasured"  # ``count`` configurations of a variant the search left


@dataclass(frozen=True)
class Unrun:
    """What did not run (one configuration, a whole variant, a range of micro-batches, a
    count of a variant's configurations), as data; words are the rendering layer's.

    Attributes:
        kind: what it stands for.
        name: the configuration's name, or the variant's label.
        size: the micro-batch a range starts at (``sizes_above``: the largest left out).
        count: how many configurations (``unmeasured``).
    """

    kind: UnrunKind
    name: str = ""
    size: int = 0
    count: int = 0

    @classmethod
    def configuration(cls, name: str) -> Unrun:
        return cls(UnrunKind.configuration, name)

    @classmethod
    def variant(cls, label: str) -> Unrun:
        return cls(UnrunKind.variant, label)
