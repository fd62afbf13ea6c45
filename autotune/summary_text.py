"""A tuning run's summary in words, rendered here once: ``summary.json``, ``summary.txt``
and the console's report all take their text from this module, the reasons included (the
tuner keeps them as data, :mod:`autotune.tuner.reasons`)."""

from __future__ import annotations

import math
import re
from typing import TYPE_CHECKING, Any

from autotune.runner.measuring_engine import measuring_engine
from autotune.tuner.reasons import NotRunKind, NotRunReason, StopKind, StopReason, Unrun, UnrunKind
from autotune.tuner.summary import AtCap

if TYPE_CHECKING:
    from pathlib import Path

    from autotune.job import TuningJob
    from autotune.tuner import TuningSummary

# What each stop says, its details filled in by position.
_STOP_TEXT = {
    StopKind.trial_cap: "tuner_num_trials ({0}) reached",
    StopKind.no_better: "no better result in the last {0} experiments",
    StopKind.model_converged: (
        "the cost model predicts no configuration left beats the best by more than {0:.0%}"
    ),
    StopKind.exhausted: "search space exhausted",
    StopKind.time_budget: "time budget of {0:g} s",
    StopKind.time_budget_kept: "time budget of {0:g} s: the rest kept for re-measuring the best",
    StopKind.time_budget_spent: "time budget of {0:g} s spent",
    StopKind.same_failure: (
        "the first {0} experiments all failed with the same error (numbers aside), so every "
        "other would too: {1}"
    ),
    StopKind.step_limit: (
        "the script ends after {0} optimizer steps whatever the micro-batch (a limit of its "
        "own, such as --max_steps, not its data), before end_profile_step ({1}): give it more "
        "steps or lower autotuning.end_profile_step"
    ),
}

# What each reason for not running says; {stop} is the stop that left it unrun, if any.
_NOT_RUN_TEXT = {
    NotRunKind.variant_rule: "{0}",
    NotRunKind.config_rule: "{0}",
    NotRunKind.oom_below: "larger than {0}, which ran out of memory",
    NotRunKind.out_of_data: (
        "the script runs out of data from micro-batch {0} ({1}): its loader has fewer batches "
        "than the profile window needs; pruned in every ZeRO variant"
    ),
    NotRunKind.data_bound: "micro-batch {0} or larger, where the script ran out of data ({1})",
    NotRunKind.failed_sizes: (
        "not searched: {0} sizes above {1} failed with an error or timeout ({2}), which says "
        "nothing about memory; list the sizes in train_micro_batch_size_per_gpu to run them"
    ),
    NotRunKind.time_budget: "not run: {stop}",
    NotRunKind.not_reached: "not reached: {stop}",
    NotRunKind.search_ended: "not reached: the search ended first ({stop})",
    NotRunKind.not_searched: "not searched: the search ended first",
    NotRunKind.none_fit: "no micro-batch ran ok",
    NotRunKind.not_measured: "not measured: {stop}",
}

# What a reason says of the stop that left it unrun where none did.
_NO_STOP_TEXT = {
    NotRunKind.not_reached: "the phase ended",
    NotRunKind.search_ended: "search complete",
    NotRunKind.not_measured: "the search ended first",
}


# A terminal's colour codes, as Ray's messages carry them; in a file they are noise.
_ANSI_ESCAPE = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


def counted(count: int, noun: str) -> str:
    """``count`` and ``noun``, plural unless one.

    Example:
        >>> counted(1, "experiment"), counted(0, "configuration")
        ('1 experiment', '0 configurations')
    """
    return f"{count} {noun}{'' if count == 1 else 's'}"


def one_line(text: str) -> str:
    r"""An error as a summary shows it: its first line, without a terminal's colour codes
    (the whole of it, traceback included, is the experiment's ``error.txt``).

    Example:
        >>> one_line("\x1b[36mray::Rank\x1b[39m failed\n  File 'a.py', line 1\n    ^^^^")
        'ray::Rank failed'
    """
    lines = [line.strip() for line in _ANSI_ESCAPE.sub("", text).splitlines() if line.strip()]
    return lines[0] if lines else ""


def failed_lines(summary: TuningSummary) -> list[str]:
    """The failed experiments, one line each: ``  name: error``."""
    return [f"  {name}: {one_line(why)}" for name, why in summary.failed.items()]


def stop_text(stop: StopReason | None) -> str:
    """Why the search stopped, in words.

    Example:
        >>> stop_text(StopReason(StopKind.trial_cap, (5,))), stop_text(None)
        ('tuner_num_trials (5) reached', 'search complete')
    """
    if stop is None:
        return "search complete"
    return one_line(_STOP_TEXT[stop.kind].format(*stop.details))


def not_run_text(reason: NotRunReason) -> str:
    """Why something did not run, in words.

    Example:
        >>> not_run_text(NotRunReason(NotRunKind.oom_below, ("z1_mbs8",)))
        'larger than z1_mbs8, which ran out of memory'
        >>> not_run_text(NotRunReason(NotRunKind.not_reached))
        'not reached: the phase ended'
    """
    stop = stop_text(reason.stop) if reason.stop else _NO_STOP_TEXT.get(reason.kind, "")
    return _NOT_RUN_TEXT[reason.kind].format(*reason.details, stop=stop)


def not_run_texts(summary: TuningSummary) -> dict[str, str]:
    """Everything not run, each with why in words (``summary.json``'s ``pruned``)."""
    return {not_run_key(unrun): not_run_text(why) for unrun, why in summary.not_run.items()}


def stopped_line(summary: TuningSummary) -> str:
    """``stopped: ...``, as every output says it."""
    return f"stopped: {stop_text(summary.stop)}"


def summary_json(
    summary: TuningSummary, optimal_path: Path | None = None, command: str | None = None
) -> dict[str, Any]:
    """``summary.json``'s contents: the summary, its reasons in words."""
    return {
        "metric": summary.metric.value,
        "best": summary.best.to_dict() if summary.best else None,
        "best_overrides": dict(summary.best_overrides),
        "top_two_within_noise": summary.top_two_within_noise,
        "best_per_variant": {k: v.to_dict() for k, v in summary.best_per_variant.items()},
        "ranking": [r.to_dict() for r in summary.ranking],
        "num_run": summary.num_run,
        "num_pruned": summary.num_not_run,
        "num_failed": summary.num_failed,
        "pruned": not_run_texts(summary),
        "failed": dict(summary.failed),
        "tuning_time_s": summary.tuning_time_s,
        "stop_reason": stop_text(summary.stop) if summary.stop is not None else "",
        "num_disturbed": summary.num_disturbed,
        "disturbed_only": list(summary.disturbed_only),
        "num_remeasured": summary.num_remeasured,
        "best_at_cap": at_cap_text(summary.best_at_cap) if summary.best_at_cap else None,
        "short_windows": dict(summary.short_windows),
        "noise": summary.noise,
        "noise_measured": summary.noise_measured,
        "waited_for_quiet_s": round(summary.waited_for_quiet_s, 1),
        "num_stopped_early": summary.num_stopped_early,
        "cost_model": dict(summary.cost_model) if summary.cost_model is not None else None,
        "num_infrastructure_retries": summary.num_infrastructure_retries,
        "optimal_config": str(optimal_path) if optimal_path else None,
        "command": command,
    }


def not_run_key(unrun: Unrun) -> str:
    """What did not run, named: a configuration or a variant by its name or label, a range
    of micro-batches, a count of a variant's configurations (``summary.json``'s keys).

    Example:
        >>> not_run_key(Unrun(UnrunKind.sizes_above, "z1", 64))
        'z1 micro-batch > 64'
        >>> not_run_key(Unrun(UnrunKind.unmeasured, "z2", count=12))
        'z2: 12 configurations'
    """
    if unrun.kind is UnrunKind.sizes_above:
        return f"{unrun.name} micro-batch > {unrun.size}"
    if unrun.kind is UnrunKind.sizes_from:
        return f"micro-batch >= {unrun.size}"
    if unrun.kind is UnrunKind.unmeasured:
        return f"{unrun.name}: {counted(unrun.count, 'configuration')}"
    return unrun.name


def not_run_label(unrun: Unrun, count: int | None = None) -> str:
    """How something not run is listed: a configuration by its name; a whole ZeRO variant
    by its label saying so (a bare ``z3`` reads as a configuration) and, with ``count``, how
    many micro-batch sizes that is; a range by its name and how many configurations.

    Example:
        >>> not_run_label(Unrun.variant("z3")), not_run_label(Unrun.variant("z3"), 31)
        ('z3 (every micro-batch)', 'z3 (31 micro-batch sizes)')
        >>> not_run_label(Unrun(UnrunKind.sizes_from, size=16), 34)
        'micro-batch >= 16 (34 configurations)'
    """
    key = not_run_key(unrun)
    if unrun.kind is UnrunKind.variant:
        sizes = "every micro-batch" if count is None else counted(count, "micro-batch size")
        return f"{key} ({sizes})"
    if count is None or unrun.kind in (UnrunKind.configuration, UnrunKind.unmeasured):
        return key
    return f"{key} ({counted(count, 'configuration')})"


def not_run_lines_in_full(summary: TuningSummary) -> list[str]:
    """``not run: N configurations``, then every entry with why (``summary.txt``)."""
    counts = summary.not_run_counts
    return [
        f"not run: {counted(summary.num_not_run, 'configuration')}",
        *(
            f"  {not_run_label(unrun, counts.get(unrun))}: {not_run_text(why)}"
            for unrun, why in summary.not_run.items()
        ),
    ]


def notes(summary: TuningSummary) -> list[str]:
    """What a person should know before acting on the ranking, one line each."""
    lines = []
    tied = summary.num_tied
    noise = ""
    if summary.noise is not None:
        # noise_measured: some configuration measured twice on a quiet machine, not merely
        # twice (on a busy one every repeat can be disturbed).
        assumed = ""
        if not summary.noise_measured:
            assumed = ", assumed: no configuration was measured twice undisturbed"
            spreads = [r.spread for r in summary.ranking if r.num_measurements > 1]
            if spreads:  # what the busy machine's repeats did show
                assumed += (
                    f"; the {counted(len(spreads), 'configuration')} measured again while "
                    f"disturbed spread {min(spreads):.0%}-{max(spreads):.0%}"
                )
        noise = f" ({summary.noise:.1%} run to run{assumed})"
    if tied > 2:
        lines.append(
            f"note: the top {tied} are within measurement noise of each other{noise}: "
            "more experiments would not tell them apart"
        )
    elif summary.top_two_within_noise:
        lines.append(f"note: the top two are within measurement noise of each other{noise}")
    if summary.best_at_cap is not None:
        lines.append(f"note: {at_cap_text(summary.best_at_cap)}")
    waited = ""
    if summary.waited_for_quiet_s:
        waited = f", and stayed busy the {summary.waited_for_quiet_s:.0f} s waited for it"
    if summary.num_disturbed and summary.num_disturbed == summary.num_run - summary.num_failed:
        lines.append(
            f"note: every measurement ({summary.num_disturbed}) was taken while other "
            f"processes competed for the ranks' cores: the machine was busy throughout{waited}, "
            "so the ranking is what a busy machine measured (measuring again would have met it "
            "busy too); run again on a quiet machine to rank with confidence"
        )
    elif summary.num_disturbed:
        after = ""
        if summary.waited_for_quiet_s:
            after = f" once it was quiet (after waiting {summary.waited_for_quiet_s:.0f} s)"
        lines.append(
            f"note: {summary.num_disturbed} measurement"
            f"{' was' if summary.num_disturbed == 1 else 's were'} taken while other processes "
            "competed for the ranks' cores; a configuration ranks on its undisturbed ones "
            f"where it has any, and the contenders were measured again{after}"
        )
    if summary.short_windows:
        seconds = sorted(summary.short_windows.values())
        wanted = math.ceil(summary.window_steps * 0.5 / max(seconds[0], 1e-6))
        which = "configuration" if len(seconds) == 1 else f"{len(seconds)} configurations"
        them = "it" if len(seconds) == 1 else "them"
        # Whether any was measured again (as the leader's check, say): never to separate them.
        runs = {ranked.name: ranked.num_measurements for ranked in summary.ranking}
        again = any(runs.get(name, 1) > 1 for name in summary.short_windows)
        how = "measured again only as a check, never" if again else "not measured again"
        lines.append(
            f"note: the profile window of {which} lasted {seconds[0]:.2f}-{seconds[-1]:.2f}"
            " s (median over its runs), too short to rank on (one busy millisecond is a "
            f"large share of it): {how} to separate {them} from the rest. Lengthen it to "
            f"about {wanted} steps: raise --end-profile-step (autotuning.end_profile_step) by "
            f"{max(1, wanted - summary.window_steps)} (a tuned script must run that many more)"
        )
    if summary.disturbed_only:
        lines.append(
            "note: measured only while disturbed (their values too low): "
            + ", ".join(summary.disturbed_only)
        )
    return lines


def at_cap_text(at_cap: AtCap) -> str:
    """Why a larger micro-batch than the best's was never tried.

    Example:
        >>> at_cap_text(AtCap(64, listed=True))[:60]
        'the best runs at micro-batch 64, the largest listed in train'
    """
    where = (
        "the largest listed in train_micro_batch_size_per_gpu"
        if at_cap.listed
        else "the largest the batch limits allow (autotuning."
        "max_train_micro_batch_size_per_gpu, max_train_batch_size)"
    )
    return (
        f"the best runs at micro-batch {at_cap.micro_batch_size}, {where}, and fitted: a "
        "larger one may be faster"
    )


def train_with(job: TuningJob, optimal_path: Path, command: str | None) -> str:
    """How to train with the best config: ``command`` (a script's, built by the tuning
    loop), else a workload's way on the engine that measured it."""
    if command is not None:
        return command
    engine = measuring_engine(job.config.autotuning.engine)
    return engine.training_hint(optimal_path, job.world_size)


def experiment_counts(summary: TuningSummary) -> str:
    """``5 experiments (4 configurations, 1 measured again)``: what ran, as every output
    says it.

    Example:
        >>> from autotune.config import Metric
        >>> from autotune.tuner import TuningSummary
        >>> experiment_counts(TuningSummary(Metric.throughput, (), None, {}, {}, None, 1, 0))
        '1 experiment (1 configuration)'
    """
    searched = summary.num_run - summary.num_remeasured
    again = f", {summary.num_remeasured} measured again" if summary.num_remeasured else ""
    return f"{counted(summary.num_run, 'experiment')} ({counted(searched, 'configuration')}{again})"


def report_lines(
    summary: TuningSummary,
    num_resumed: int,
    optimal_path: Path | None,
    training: str | None,
    not_run: list[str],
) -> list[str]:
    """The console's report under its ranked table: the counts, why the search stopped, the
    failures, what did not run (``not_run``, grouped for a screen), the notes, and the
    config to train with (``training``: see :func:`train_with`)."""
    lines = [
        f"{experiment_counts(summary)}, {summary.num_failed} failed or out of memory "
        f"({num_resumed} from earlier runs); {stopped_line(summary)}",
        *failed_lines(summary),
        *not_run,
        *notes(summary),
    ]
    if optimal_path is None:
        return [*lines, "no experiment ran ok; see summary.txt in the results directory"]
    lines.append(f"optimal config: {optimal_path}")
    if training is not None:
        lines.append(f"train with it: {training}")
    return lines


def format_summary(
    summary: TuningSummary, optimal_path: Path | None, job: TuningJob, command: str | None = None
) -> str:
    """The human-readable summary written next to ``summary.json``."""
    metric = summary.metric.value
    lines = [
        f"autotune: {job.label} at world size {job.world_size}, metric {metric}",
        f"{experiment_counts(summary)}, {summary.num_failed} failed or out of memory; not run: "
        f"{counted(summary.num_not_run, 'configuration')}; tuning time: "
        f"{summary.tuning_time_s:.0f} s",
        stopped_line(summary),
    ]
    if summary.num_infrastructure_retries:
        lines.append(
            f"infrastructure retries: {summary.num_infrastructure_retries} (a rendezvous port "
            "taken or a rank lost before its experiment began: run again, not a verdict)"
        )
    if summary.best is None:
        lines.append("no experiment ran ok: see the failures below")
    else:
        best = summary.best
        shown = summary.metric.display(best.value)
        runs = f"spread {best.spread:.0%}" if best.num_measurements > 1 else "measured once"
        lines.append(f"best: {best.name}  {metric} {shown} ({runs})")
        lines += notes(summary)
        if optimal_path is not None:
            lines.append(f"optimal config: {optimal_path}")
            lines.append(f"measured on: {measuring_engine(job.config.autotuning.engine).label}")
            lines.append(f"train with it: {train_with(job, optimal_path, command)}")
    if summary.best_per_variant:
        lines.append("best per ZeRO variant:")
        for variant, ranked in summary.best_per_variant.items():
            shown = summary.metric.display(ranked.value)
            lines.append(f"  {variant:12s} {ranked.name:40s} {metric} {shown}")
    if summary.failed:
        lines.append(f"failed: {summary.num_failed}")
        lines += failed_lines(summary)
    lines += not_run_lines_in_full(summary)
    return "\n".join(lines)
