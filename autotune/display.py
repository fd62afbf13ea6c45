"""Showing a tuning run to a person: live progress and the final ranked table (rich)."""

from __future__ import annotations

import sys
import time
from typing import TYPE_CHECKING

from rich import box
from rich.console import Console
from rich.live import Live
from rich.table import Table
from rich.text import Text

from autotune.config.sizes import format_size
from autotune.metric import PEAK_MEMORY_LABEL
from autotune.summary_text import counted, not_run_label, not_run_text, report_lines
from autotune.tuner.candidate import Phase
from autotune.tuning import EventKind

if TYPE_CHECKING:
    from autotune.planning import Plan
    from autotune.tuner import TuningSummary
    from autotune.tuner.plan import PlannedConfig
    from autotune.tuner.ranking import Ranked
    from autotune.tuner.reasons import NotRunReason, Unrun
    from autotune.tuning import TuningEvent, TuningReport

# What the run is doing while experiments of a phase run, for a person.
DOING = {
    Phase.max_micro_batch: "finding each ZeRO variant's largest micro-batch",
    Phase.micro_batch: "comparing micro-batch sizes",
    Phase.knobs: "tuning each ZeRO variant's knobs",
    Phase.remeasure: "measuring the leaders again, so that no single run decides the ranking",
}


# Off a terminal (a log, a pipe, a test), wide enough for any table row on one line; a
# table takes only the width it needs.
PIPED_WIDTH = 1000


def output_console() -> Console:
    """The console a command prints to: a terminal's own width (rich reads it, or
    ``COLUMNS``); anything else gets every row on one line, whatever terminal the command was
    started from, rather than rich's 80 columns that fold a table and split a command."""
    return Console() if sys.stdout.isatty() else Console(width=PIPED_WIDTH)


def print_line(console: Console, line: str) -> None:
    """One line of plain text, never broken by rich: a command or a path in it stays whole
    to copy (a terminal folds a long line only on screen)."""
    console.print(line, highlight=False, markup=False, soft_wrap=True)


class Progress:
    """Live status while tuning; with ``quiet``, one plain log line per experiment instead."""

    def __init__(self, console: Console, quiet: bool) -> None:
        self.console = console
        self.quiet = quiet
        self.started = time.monotonic()
        self.running: list[str] = []  # "name (phase)" of each experiment in flight
        self.phases: list[Phase] = []  # the phases of the experiments in flight
        self.run_here = 0  # experiments finished by this process (not replayed from the log)
        self._logged_phase: Phase | None = None
        self._live: Live | None = None

    def __enter__(self) -> Progress:
        if not self.quiet:
            # Transient: an error or the final report follows on a line of its own.
            self._live = Live(
                Text("starting..."), console=self.console, refresh_per_second=4, transient=True
            )
            self._live.__enter__()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def stop(self) -> None:
        """End the live display (the run's report follows it); again does nothing."""
        if self._live is not None:
            self._live.__exit__(None, None, None)
            self._live = None

    def __call__(self, event: TuningEvent) -> None:
        summary = event.summary
        if event.kind is EventKind.resumed:
            self._log(f"resuming: {counted(summary.num_run, 'experiment')} already finished")
        elif event.kind is EventKind.started and event.candidate is not None:
            phase = event.candidate.phase
            if self.quiet and phase != self._logged_phase and phase in DOING:
                self._log(f"now {DOING[phase]}")  # the live display has a row for it
                self._logged_phase = phase
            if self.quiet and event.running[1:]:  # several at once: say when each starts
                self._log(f"{event.candidate.name}: started ({len(event.running)} running)")
        elif event.kind is EventKind.waiting and event.wait_s is not None:
            self._log(
                f"the machine is busy: waiting up to {event.wait_s:.0f} s for it to quiet "
                "down before measuring again what it slowed"
            )
        elif event.kind is EventKind.finished and event.result is not None:
            result = event.result
            metric = summary.metric
            if result.metrics is not None:
                what = f"ok  {metric.display(metric.of(result.metrics))}"
            else:  # whole, on one line: the terminal folds it on screen
                what = f"{result.status.value}  {result.error or ''}"
            self._log(f"{result.name}: {what}  ({result.duration_s:.1f} s)")
            self.run_here += 1
        self.running = [f"{c.name} ({c.phase.value})" for c in event.running]
        self.phases = list(dict.fromkeys(c.phase for c in event.running))
        if self._live is not None:
            self._live.update(self._status(summary))

    def _log(self, line: str) -> None:
        print_line(self.console, line)

    def _status(self, summary: TuningSummary) -> Table:
        elapsed = time.monotonic() - self.started
        done = summary.num_run
        table = Table.grid(padding=(0, 2))
        # The trial cap counts every experiment, re-measurements included: a bound on the run.
        table.add_row(
            "experiments",
            f"{done} of at most {summary.search_bound} ({summary.num_failed} failed/oom), "
            f"{counted(summary.num_not_run, 'configuration')} not run",
        )
        doing = "; ".join(DOING[phase] for phase in self.phases if phase in DOING)
        if doing:
            table.add_row("now", doing)
        if summary.best is not None:
            value = summary.metric.display(summary.best.value)
            table.add_row("best so far", f"{summary.best.name}  {value}")
        remaining = ""
        left = max(0, summary.search_bound - done)
        if self.run_here and left:  # the pace of this process, not of replayed history
            remaining = f", at most ~{left * elapsed / self.run_here:.0f} s more at this pace"
        table.add_row("elapsed", f"{elapsed:.0f} s{remaining}")
        for index, running in enumerate(self.running):
            table.add_row("running" if index == 0 else "", running)
        return table


def ranked_table(summary: TuningSummary, top: int = 10) -> Table:
    """The top configurations, best first, with spread and peak memory."""
    metric = summary.metric
    table = Table(title=f"top experiments by {metric.value}")
    table.add_column("#", justify="right")
    table.add_column("experiment")
    table.add_column(metric.value, justify="right")
    table.add_column("runs", justify="right")
    table.add_column("spread", justify="right")
    table.add_column(PEAK_MEMORY_LABEL, justify="right")
    for index, ranked in enumerate(summary.ranking[:top], start=1):
        table.add_row(
            str(index),
            ranked.name,
            metric.display(ranked.value),
            str(ranked.num_measurements),
            _spread_text(ranked),
            format_size(ranked.peak_memory_bytes),
        )
    return table


def _spread_text(ranked: Ranked) -> str:
    """The spread over a configuration's runs, blank where it ran once (no spread to show:
    ``0%`` would read as perfectly steady)."""
    return f"{ranked.spread:.0%}" if ranked.num_measurements > 1 else ""


# Names shown per reason a configuration did not run; summary.txt lists every one.
NAMES_PER_REASON = 6


def not_run_lines(summary: TuningSummary) -> list[str]:
    """``not run: N configurations``, then one line per reason (its kind and details, not its
    words): how many configurations, why, and which (a whole variant by its label)."""
    by_reason: dict[NotRunReason, list[Unrun]] = {}
    for unrun, why in summary.not_run.items():
        by_reason.setdefault(why, []).append(unrun)
    counts = summary.not_run_counts

    def configurations(names: list[Unrun]) -> int:
        return sum(counts.get(name, 1) for name in names)

    lines = [f"not run: {counted(summary.num_not_run, 'configuration')}"]
    for why, names in sorted(by_reason.items(), key=lambda item: -configurations(item[1])):
        shown = ", ".join(
            not_run_label(name, counts.get(name)) for name in names[:NAMES_PER_REASON]
        )
        more = f" and {len(names) - NAMES_PER_REASON} more" if len(names) > NAMES_PER_REASON else ""
        lines.append(f"  {configurations(names)} {not_run_text(why)}: {shown}{more}")
    return lines


def print_report(console: Console, report: TuningReport) -> None:
    """The ranked table, then the report's lines (:func:`autotune.summary_text.report_lines`)."""
    summary = report.summary
    console.print(ranked_table(summary))
    lines = report_lines(
        summary,
        report.num_resumed,
        report.optimal_config_path,
        report.train_with,
        not_run_lines(summary),
    )
    for line in lines:
        print_line(console, line)


# Configurations the plan's table shows unless told (--top): the leaders, not every size.
PLAN_ROWS = 20


def plan_header(planned: Plan, shown: int) -> list[str]:
    """What a plan predicts for, above its table: where its inputs came from, the model, the
    device, how many rows of how many, and a cap on the micro-batch that memory did not set."""
    model, hardware = planned.model, planned.hardware
    source = "the constants a run fitted" if planned.fitted else "the datasheet"
    sample = f", {planned.sample}" if planned.sample else ""
    lines = [planned.origin] if planned.origin else []
    lines += [
        f"model: {planned.workload}, {_count_words(model.num_params)} parameters in "
        f"{planned.precision}{sample}",
        f"predicted on {planned.world_size} x {hardware.name} with "
        f"{format_size(hardware.memory_bytes)} each ({source}); a prediction, not a "
        "measurement: autotune run measures",
    ]
    total = len(planned.rows)
    if shown < total:
        lines.append(f"the best {shown} of {total} (--top N for more, --format json for all)")
    if planned.micro_batch_cap is not None:
        where = (
            "the largest listed in train_micro_batch_size_per_gpu"
            if planned.cap_listed
            else "the config's cap (autotuning.max_train_micro_batch_size_per_gpu, "
            "max_train_batch_size)"
        )
        lines.append(
            f"note: the micro-batch stops at {planned.micro_batch_cap}, {where}, not at the "
            "memory: raise it to plan larger ones"
        )
    return lines


def _count_words(count: int) -> str:
    """``5.8M``, ``1.3B``: a parameter count as people say it.

    Example:
        >>> _count_words(5_812_352), _count_words(1_300_000_000), _count_words(950)
        ('5.8M', '1.3B', '950')
    """
    for unit, size in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if count >= size:
            return f"{count / size:.1f}{unit}"
    return str(count)


def _tflops_text(tflops: float) -> str:
    """Three significant digits: a CPU rank's 0.00195 TFLOPS is not 0.0.

    Example:
        >>> _tflops_text(0.001953), _tflops_text(19.87), _tflops_text(312.4)
        ('0.00195', '19.9', '312.4')
    """
    return f"{tflops:.1f}" if tflops >= 100 else f"{tflops:.3g}"


def print_plan(planned: Plan, top: int = PLAN_ROWS) -> None:
    """``autotune plan``'s table: what it is for, then the best ``top`` configurations."""
    console = output_console()
    rows = planned.rows[:top]
    # Above the table, not its title: a title wraps at the table's width, mid-sentence.
    for line in plan_header(planned, len(rows)):
        print_line(console, line)
    table = Table(
        box=box.SIMPLE_HEAD,  # no vertical rules: the eight columns fit 80 characters
        pad_edge=False,
        collapse_padding=True,
    )
    # The name says the stage, the micro-batch and the offload (z2_ocpu_mbs8), so an
    # 80-column terminal still holds every column; --format json has them apart.
    table.add_column("config", no_wrap=True)
    for column in ("accum", "samples/s", "80% range", "s/step", "TFLOPS", "memory", "fits"):
        table.add_column(column, justify="right", no_wrap=True)
    for row in rows:
        table.add_row(
            row.name,
            str(row.gradient_accumulation_steps),
            f"{row.throughput:.1f}",
            f"{row.throughput_low:.0f}-{row.throughput_high:.0f}",
            f"{row.latency:.3f}",
            _tflops_text(row.tflops_per_gpu),
            format_size(row.memory_bytes),
            "yes" if row.fits else "no",
        )
    console.print(table)
    for line in plan_misses(rows):
        print_line(console, line)


def plan_misses(rows: list[PlannedConfig]) -> list[str]:
    """Below a plan's table: how far each configuration that does not fit is over.

    Example:
        >>> from autotune.tuner.plan import PlannedConfig
        >>> row = PlannedConfig("z3_mbs2", 3, 2, 1, "none", 27.4, 21.0, 35.0, 4.7, 153.0,
        ...                     90 * 2**30, False, over_bytes=18 * 2**30)
        >>> plan_misses([row])
        ['z3_mbs2 does not fit: 90.0 GiB, 18.0 GiB over the 72.0 GiB it may use']
    """
    return [
        f"{row.name} does not fit: {format_size(row.memory_bytes)}, "
        f"{format_size(row.over_bytes)} over the "
        f"{format_size(row.memory_bytes - row.over_bytes)} it may use"
        for row in rows
        if not row.fits
    ]
