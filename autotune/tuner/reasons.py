"""Why the search stopped and why a configuration did not run, as data: a kind and its
details. The words are the rendering layer's (:mod:`autotune.summary_text`), written once
there; summaries group and compare reasons by kind, never by their text."""

from __future__ import annotations

import enum
from dataclasses import dataclass

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
