"""The plain-text summary of a tuning run that is written next to ``summary.json``."""

from __future__ import annotations

from typing import TYPE_CHECKING

from autotune.config import EngineName
from autotune.runner.measuring_engine import measuring_engine
from autotune.tuner.space import Variant

if TYPE_CHECKING:
    from pathlib import Path

    from autotune.job import TuningJob
    from autotune.tuner import TuningSummary


# A whole ZeRO variant among the configurations not run is named by its label (``z3``,
# ``z3_ocpu``): every one it could have had.
_VARIANT_LABELS = {Variant(stage, offload).label for stage in range(4) for offload in (False, True)}


def not_run_label(name: str) -> str:
    """How a configuration not run is listed: its name, or for a whole ZeRO variant its
    label saying so (a bare ``z3`` reads as a configuration).

    Example:
        >>> not_run_label("z3"), not_run_label("z3_mbs4"), not_run_label("micro-batch >= 16")
        ('z3 (every micro-batch)', 'z3_mbs4', 'micro-batch >= 16')
    """
    return f"{name} (every micro-batch)" if name in _VARIANT_LABELS else name


def format_summary(
    summary: TuningSummary, optimal_path: Path | None, job: TuningJob, command: str | None = None
) -> str:
    """The human-readable summary written next to ``summary.json``."""
    metric = summary.metric.value
    lines = [
        f"autotune: {job.label} at world size {job.world_size}, metric {metric}",
        f"experiments run: {summary.num_run} ({summary.num_run - summary.num_remeasured} "
        f"searched, {summary.num_remeasured} re-measured; failed {summary.num_failed}), "
        f"not run: {summary.num_pruned}, tuning time: {summary.tuning_time_s:.0f} s",
        f"stopped: {summary.stop_reason or 'search complete'}",
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
        lines.append(f"best: {best.name}  {metric} {shown} (spread {best.spread:.0%})")
        lines += summary.notes()
        if optimal_path is not None:
            lines.append(f"optimal config: {optimal_path}")
            engine = job.config.autotuning.engine
            lines.append(f"measured on: {measuring_engine(engine).label}")
            if command is not None:
                lines.append(f"train with it: {command}")
            elif engine is EngineName.deepspeed:
                lines.append(
                    f"train with it: deepspeed train.py --deepspeed_config {optimal_path} "
                    "(the engine that measured it)"
                )
            else:
                lines.append(
                    f"train with it: your DeepSpeed script with --deepspeed_config {optimal_path} "
                    "(on the built-in engine: autotune exec --nproc "
                    f"{job.world_size} -- train.py ...)"
                )
    if summary.best_per_variant:
        lines.append("best per ZeRO variant:")
        for variant, ranked in summary.best_per_variant.items():
            shown = summary.metric.display(ranked.value)
            lines.append(f"  {variant:12s} {ranked.name:40s} {metric} {shown}")
    if summary.failed:
        lines.append(f"failed: {summary.num_failed}")
        lines += [f"  {name}: {why}" for name, why in summary.failed.items()]
    lines.append(f"not run: {summary.num_pruned}")
    lines += [f"  {not_run_label(name)}: {why}" for name, why in summary.pruned.items()]
    return "\n".join(lines)
