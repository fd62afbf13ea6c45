"""What a person sees while tuning: each running experiment, what the run is doing, how many
experiments at most, and which configurations were not run."""

from __future__ import annotations

import io
import re
from dataclasses import replace
from pathlib import Path

from rich.console import Console

from autotune.config import Metric
from autotune.display import Progress, not_run_lines, print_report
from autotune.experiment import ExperimentResult, ExperimentSpec, Metrics, Status
from autotune.results import load_results
from autotune.tuner import TuningSummary
from autotune.tuner.candidate import Phase
from autotune.tuner.reasons import NotRunKind, NotRunReason, Unrun
from autotune.tuning import EventKind, TuningEvent, tune
from tests.fake_cluster import FakeCluster
from tests.runner.sim_cluster import config_metrics, tuning_job


def test_every_running_experiment_is_shown(tmp_path: Path) -> None:
    out = io.StringIO()
    progress = Progress(Console(file=out, width=200), quiet=True)
    tables = []

    def watch(event: TuningEvent) -> None:
        progress(event)
        if len(event.running) == 3:  # what the live display would draw now
            tables.append(progress._status(event.summary))

    tune(tuning_job(tmp_path), FakeCluster(fits=3), on_event=watch)
    assert "started (3 running)" in out.getvalue()
    rendered = io.StringIO()
    Console(file=rendered, width=200).print(tables[0])
    shown = [
        line for line in rendered.getvalue().splitlines() if re.search(r"_mbs\S* \(\w+\)", line)
    ]
    assert len(shown) == 3 and shown[0].lstrip().startswith("running")


class Measured:
    """Every configuration measures as :func:`config_metrics` says, each window's steps
    spread ±20% around it: noisy enough that the leader is measured again."""

    def run(self, spec: ExperimentSpec) -> ExperimentResult:
        metrics = config_metrics(spec)
        step = metrics.step_times_s[0]
        steps = [step * factor for factor in (1.2, 1.0, 1 / 1.2)]
        noisy = Metrics.from_window(steps, metrics.train_batch_size, 1e9, 0)
        return ExperimentResult(spec.name, Status.ok, noisy)


def test_the_status_says_what_the_run_is_doing_and_bounds_every_experiment(
    tmp_path: Path,
) -> None:
    progress = Progress(Console(file=io.StringIO(), width=200), quiet=True)
    shown: dict[Phase, str] = {}

    def watch(event: TuningEvent) -> None:
        progress(event)
        if event.kind is EventKind.started and event.candidate is not None:
            rendered = io.StringIO()
            Console(file=rendered, width=200).print(progress._status(event.summary))
            shown.setdefault(event.candidate.phase, rendered.getvalue())

    summary = tune(tuning_job(tmp_path), Measured(), on_event=watch).summary
    assert Phase.remeasure in shown and Phase.max_micro_batch in shown
    remeasuring = shown[Phase.remeasure]
    assert re.search(r"now\s+measuring the leaders again", remeasuring), remeasuring
    assert re.search(rf"experiments\s+\d+ of at most {summary.search_bound} ", remeasuring)
    assert "plus re-measurements" not in remeasuring
    assert re.search(
        r"now\s+finding each ZeRO variant's largest micro-batch", shown[Phase.max_micro_batch]
    )
    # Quiet mode logs the same, once per phase.
    log = progress.console.file.getvalue()  # type: ignore[attr-defined]
    assert log.count("now measuring the leaders again") == 1


def test_a_zero_variant_not_run_is_named_as_the_whole_variant() -> None:
    summary = TuningSummary(
        metric=Metric.throughput,
        ranking=(),
        best=None,
        best_overrides={},
        best_per_variant={},
        top_two_within_noise=None,
        num_run=0,
        num_failed=0,
        not_run={
            Unrun.variant("z3"): NotRunReason(NotRunKind.search_ended),
            Unrun.configuration("z3_mbs4"): NotRunReason(NotRunKind.search_ended),
            Unrun.variant("z2_ocpu"): NotRunReason(
                NotRunKind.variant_rule, ("pruned by the memory estimate",)
            ),
        },
    )
    assert not_run_lines(summary) == [
        "not run: 3 configurations",
        "  2 not reached: the search ended first (search complete): z3 (every micro-batch), "
        "z3_mbs4",
        "  1 pruned by the memory estimate: z2_ocpu (every micro-batch)",
    ]
    # Counted, a whole variant is as many configurations as it has micro-batch sizes.
    counts = {Unrun.variant("z3"): 31, Unrun.configuration("z3_mbs4"): 1}
    counted = replace(summary, not_run_counts={**counts, Unrun.variant("z2_ocpu"): 32})
    assert not_run_lines(counted) == [
        "not run: 64 configurations",
        "  32 not reached: the search ended first (search complete): z3 (31 micro-batch "
        "sizes), z3_mbs4",
        "  32 pruned by the memory estimate: z2_ocpu (32 micro-batch sizes)",
    ]


def test_a_report_line_is_never_broken_however_narrow_the_console(tmp_path: Path) -> None:
    report = tune(tuning_job(tmp_path), FakeCluster(fits=3))
    command = "torchrun --nproc_per_node 2 " + "/a/long/path/" * 12 + "train.py"
    out = io.StringIO()
    print_report(Console(file=out, width=40), replace(report, train_with=command))
    assert f"train with it: {command}" in out.getvalue().splitlines()
    assert f"optimal config: {report.optimal_config_path}" in out.getvalue().splitlines()


def test_a_spread_is_shown_only_for_a_configuration_measured_more_than_once(
    tmp_path: Path,
) -> None:
    report = tune(tuning_job(tmp_path), Measured())
    out = io.StringIO()
    print_report(Console(file=out, width=200), report)
    cells = {
        row[1]: row
        for line in out.getvalue().splitlines()
        if len(row := [cell.strip() for cell in line.strip("│ ").split("│")]) == 6
    }
    shown = report.summary.ranking[:10]
    assert any(r.num_measurements == 1 for r in shown) and any(
        r.num_measurements > 1 for r in shown
    )
    for ranked in shown:
        runs, spread = cells[ranked.name][3], cells[ranked.name][4]
        assert runs == str(ranked.num_measurements)
        assert (spread == "") is (ranked.num_measurements == 1), cells[ranked.name]
    best = report.summary.best
    assert best is not None and best.num_measurements > 1  # the leader is measured again
    summary = (report.results_dir / "summary.txt").read_text()
    assert f"best: {best.name}  throughput " in summary
    assert f"(spread {best.spread:.0%})" in summary
    # load_results has no spread for one measurement either.
    frame = load_results(report.results_dir, ranked_by=Metric.throughput).set_index("name")
    for ranked in shown:
        spread = frame.loc[ranked.name, "spread"]
        assert bool(spread != spread) is (ranked.num_measurements == 1)  # NaN: none
