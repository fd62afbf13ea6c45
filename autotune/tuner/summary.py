"""What a tuning run found, as plain data the results package writes out, and how the
tuner's record of the run becomes it (:func:`summarize`)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from autotune.config import AutotuningConfig, Metric
from autotune.experiment import ExperimentResult
from autotune.tuner.cost_model import CostModel
from autotune.tuner.ledger import Entry, Ledger
from autotune.tuner.naming import split_repeat
from autotune.tuner.ranking import TOLERANCE, Ranked, declared_order, rank, within_noise
from autotune.tuner.remeasure import short_windows
from autotune.tuner.space import TuningSpace


@dataclass(frozen=True)
class TuningSummary:
    """The outcome of a tuning run (or of the run so far).

    Attributes:
        metric: what was optimised.
        ranking: every configuration that ran ok, repeats folded, in the one order every
            output shows (:func:`~autotune.tuner.ranking.declared_order`: by median, those
            measured more than once first once any was).
        best: the first of ``ranking``.
        best_overrides: the dotted-key values that make the user's config the best one.
        best_per_variant: the best configuration of each ZeRO variant (``z2``, ``z3_ocpu``).
        top_two_within_noise: whether the first two of ``ranking`` are within the noise of
            each other (see :meth:`ties`; None with fewer than two).
        num_run: experiments that ran, re-measurements included.
        num_failed: experiments that ran and did not end ``ok``.
        pruned: configurations and variants never run, each with the reason.
        failed: experiments that did not end ``ok``: ``"oom: ..."``, ``"error: ..."``.
        tuning_time_s: wall time, across resumed runs.
        stop_reason: why the search ended.
        num_disturbed: measurements taken while other processes competed for the ranks'
            cores (see :mod:`autotune.profiling.interference`); a configuration ranks on the
            others where it has any.
        search_bound: the most experiments the run can make, re-measurements included (the
            trial cap).
        short_windows: configurations whose profile window lasted under the tuner's
            ``MIN_WINDOW_S``, with its median length in seconds: too short to rank on.
        window_steps: optimizer steps in the profile window.
        num_remeasured: of ``num_run``, the re-measurements (the rest searched the space).
        best_at_cap: why a larger micro-batch than the best's was never tried, when the best
            runs at the largest the config allows (a larger one may be faster); else None.
        noise: the relative noise of one measurement, from the repeats (None: not known).
        num_stopped_early: search experiments stopped after their first timed steps, slower
            than the best by more than the tolerance allowed (their values are from those
            steps).
        cost_model: ``model_based``'s cost model as last fitted (its constants with their
            uncertainties, see :meth:`autotune.tuner.cost_model.CostModel.to_dict`).
        num_infrastructure_retries: experiments run again by the runner after a failure of
            the machinery, not of the configuration (a port taken, a rank lost before it began).
    """

    metric: Metric
    ranking: tuple[Ranked, ...]
    best: Ranked | None
    best_overrides: Mapping[str, Any]
    best_per_variant: Mapping[str, Ranked]
    top_two_within_noise: bool | None
    num_run: int
    num_failed: int
    pruned: Mapping[str, str] = field(default_factory=dict)
    failed: Mapping[str, str] = field(default_factory=dict)
    tuning_time_s: float = 0.0
    stop_reason: str = ""
    num_disturbed: int = 0
    search_bound: int = 0
    short_windows: Mapping[str, float] = field(default_factory=dict)
    window_steps: int = 0
    num_remeasured: int = 0
    best_at_cap: str | None = None
    noise: float | None = None
    num_stopped_early: int = 0
    cost_model: Mapping[str, Any] | None = None
    num_infrastructure_retries: int = 0

    @property
    def num_tied(self) -> int:
        """How many of the ranking's first configurations are within measurement noise of
        the best (see :func:`tied`): 1 when the best stands alone."""
        if self.best is None:
            return 0
        count = 1
        for ranked in self.ranking[1:]:
            if not tied(self.best, ranked, self.noise):
                break
            count += 1
        return count

    def notes(self) -> list[str]:
        """What a person should know before acting on the ranking, one line each."""
        lines = []
        tied = self.num_tied
        noise = f" ({self.noise:.1%} run to run)" if self.noise is not None else ""
        if tied > 2:
            lines.append(
                f"note: the top {tied} are within measurement noise of each other{noise}: "
                "more experiments would not tell them apart"
            )
        elif self.top_two_within_noise:
            lines.append(f"note: the top two are within measurement noise of each other{noise}")
        if self.best_at_cap:
            lines.append(f"note: {self.best_at_cap}")
        if self.num_disturbed:
            lines.append(
                f"note: {self.num_disturbed} measurement"
                f"{' was' if self.num_disturbed == 1 else 's were'} taken while other processes "
                "competed for the ranks' cores; a configuration ranks on its undisturbed ones "
                "where it has any, and the contenders were measured again"
            )
        if self.short_windows:
            seconds = sorted(self.short_windows.values())
            wanted = math.ceil(self.window_steps * 0.5 / max(seconds[0], 1e-6))
            which = "configuration" if len(seconds) == 1 else f"{len(seconds)} configurations"
            lines.append(
                f"note: the profile window of {which} lasted {seconds[0]:.2f}-{seconds[-1]:.2f}"
                " s (median over its runs), too short to rank on (one busy millisecond is a "
                "large share of it): measured again but not raced. Lengthen it: about "
                f"{wanted} steps between start_profile_step and end_profile_step (the script "
                "must run that many)"
            )
        if self.disturbed_only:
            lines.append(
                "note: measured only while disturbed (their values too low): "
                + ", ".join(self.disturbed_only)
            )
        return lines

    @property
    def disturbed_only(self) -> tuple[str, ...]:
        """Configurations ranked on disturbed measurements alone (their values too low)."""
        return tuple(r.name for r in self.ranking if r.disturbed)

    @property
    def num_pruned(self) -> int:
        return len(self.pruned)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready."""
        return {
            "metric": self.metric.value,
            "best": self.best.to_dict() if self.best else None,
            "best_overrides": dict(self.best_overrides),
            "top_two_within_noise": self.top_two_within_noise,
            "best_per_variant": {k: v.to_dict() for k, v in self.best_per_variant.items()},
            "ranking": [r.to_dict() for r in self.ranking],
            "num_run": self.num_run,
            "num_pruned": self.num_pruned,
            "num_failed": self.num_failed,
            "pruned": dict(self.pruned),
            "failed": dict(self.failed),
            "tuning_time_s": self.tuning_time_s,
            "stop_reason": self.stop_reason,
            "num_disturbed": self.num_disturbed,
            "disturbed_only": list(self.disturbed_only),
            "num_remeasured": self.num_remeasured,
            "best_at_cap": self.best_at_cap,
            "short_windows": dict(self.short_windows),
            "noise": self.noise,
            "num_stopped_early": self.num_stopped_early,
            "cost_model": dict(self.cost_model) if self.cost_model is not None else None,
            "num_infrastructure_retries": self.num_infrastructure_retries,
        }


def summarize(
    ledger: Ledger,
    space: TuningSpace,
    tuning: AutotuningConfig,
    *,
    not_run: Mapping[str, str],
    tuning_time_s: float,
    stop_reason: str,
    noise: float | None = None,
    cost_model: CostModel | None = None,
) -> TuningSummary:
    """The summary of what ``ledger`` holds, searched over ``space`` under ``tuning``;
    ``not_run``: what was considered and not run, each with the reason."""
    metric = tuning.metric
    ranked = [r for r in rank(ledger.results.values(), metric) if r.name in ledger.entries]
    ranking = declared_order(ranked)
    best = ranking[0] if ranking else None
    per_variant: dict[str, Ranked] = {}
    for entry in ranking:
        per_variant.setdefault(ledger.entries[entry.name].variant.label, entry)
    failed = {name: _failure_line(r) for name, r in ledger.results.items() if not r.ok}
    best_entry = ledger.entries[best.name] if best is not None else None
    return TuningSummary(
        metric=metric,
        ranking=tuple(ranking),
        best=best,
        best_overrides=dict(best_entry.overrides) if best_entry else {},
        best_per_variant=per_variant,
        top_two_within_noise=(tied(ranking[0], ranking[1], noise) if len(ranking) > 1 else None),
        num_run=len(ledger.results),
        num_failed=len(failed),
        pruned=not_run,
        failed=failed,
        tuning_time_s=tuning_time_s,
        stop_reason=stop_reason,
        num_disturbed=sum(
            1 for r in ledger.results.values() if r.metrics is not None and r.metrics.disturbed
        ),
        search_bound=tuning.tuner_num_trials,
        short_windows={
            name: seconds
            for name, seconds in short_windows(ledger).items()
            if name in ledger.entries
        },
        window_steps=tuning.end_profile_step - tuning.start_profile_step + 1,
        num_remeasured=sum(1 for n in ledger.results if split_repeat(n)[1] > 0),
        best_at_cap=_at_cap(best_entry, space),
        noise=noise,
        num_stopped_early=sum(
            1 for r in ledger.results.values() if r.stopped_after_steps is not None
        ),
        cost_model=cost_model.to_dict() if cost_model is not None else None,
        num_infrastructure_retries=sum(r.infrastructure_retries for r in ledger.results.values()),
    )


def _at_cap(best: Entry | None, space: TuningSpace) -> str | None:
    """Why no larger micro-batch than the best's was tried, where the best runs at the
    largest its variant's sizes allow (and fitted): a larger one may be faster."""
    plan = next((p for p in space.plans if best and p.variant == best.variant), None)
    if best is None or plan is None or best.micro_batch_size != plan.ladder[-1]:
        return None
    where = (
        "the largest listed in train_micro_batch_size_per_gpu"
        if not plan.halving
        else "the largest the batch limits allow (autotuning."
        "max_train_micro_batch_size_per_gpu, max_train_batch_size)"
    )
    return (
        f"the best runs at micro-batch {best.micro_batch_size}, {where}, and fitted: a "
        "larger one may be faster"
    )


def _failure_line(result: ExperimentResult) -> str:
    """``"oom: OutOfMemoryError: ..."``: the status, then the error unless it already says it."""
    status, error = result.status.value, result.error or ""
    return error if error.startswith(f"{status}:") else f"{status}: {error}" if error else status


def tied(best: Ranked, other: Ranked, noise: float | None) -> bool:
    """Whether ``other`` is within measurement noise of ``best``: their measured ranges
    overlap, or their medians are closer than the tolerance or than 1.64 times the noise of
    their difference (``noise``: relative, of one measurement).

    Example:
        >>> tied(Ranked("a", 100, (100,), 0), Ranked("b", 97, (97,), 0), 0.03)
        True
        >>> tied(Ranked("a", 100, (100,), 0), Ranked("b", 80, (80,), 0), 0.03)
        False
    """
    if within_noise(best, other):
        return True
    if best.value <= 0 or other.value <= 0:
        return False
    gap = abs(math.log(best.value) - math.log(other.value))
    spread = 0.0
    if noise is not None:
        spread = 1.64 * noise * math.sqrt(1 / best.num_measurements + 1 / other.num_measurements)
    return gap <= max(math.log(1 + TOLERANCE), spread)
