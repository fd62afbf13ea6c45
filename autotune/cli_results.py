"""``autotune report`` and ``autotune best``: what a results directory holds, printed. They
parse and read :mod:`autotune.results`; :func:`register` adds them to the command line
(``autotune.cli``)."""

from __future__ import annotations

import enum
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer

from autotune.config import Metric
from autotune.config.sizes import format_size
from autotune.defaults import default_results_dir
from autotune.metric import PEAK_MEMORY_COLUMN, PEAK_MEMORY_LABEL

# DIR of report and best: run's default results directory, so that `autotune run` and then
# `autotune report` need no path.
_RESULTS_DIR_HELP = "A results directory (default: run's, autotuning_results)."


class ReportFormat(str, enum.Enum):
    table = "table"
    csv = "csv"
    json = "json"


def register(app: typer.Typer, fail: Callable[[str], typer.Exit]) -> None:
    """Add ``report`` and ``best`` to ``app``; ``fail`` turns a message into the one-line
    error and exit 2 every command gives bad input."""

    @app.command()
    def report(
        results_dir: Annotated[
            Path | None, typer.Argument(help=_RESULTS_DIR_HELP, show_default=False)
        ] = None,
        format: Annotated[ReportFormat, typer.Option("--format", "-f")] = ReportFormat.table,
        metric: Annotated[Metric | None, typer.Option(case_sensitive=False)] = None,
        runs: Annotated[
            bool,
            typer.Option("--runs", help="Every measurement on its own, re-measurements included."),
        ] = False,
    ) -> None:
        """Print the run's ranking: configurations best first, repeats folded (as summary.txt
        and best name the winner); --runs: every measurement by its own value."""
        from autotune.results import ResultsDir, ResultsDirError, load_results

        results_dir = results_dir or default_results_dir()
        chosen = metric or ResultsDir(results_dir).ranked_metric()
        try:
            frame = load_results(results_dir, ranked_by=chosen, runs=runs)
        except (ResultsDirError, ValueError) as err:
            raise fail(str(err)) from None
        if format is ReportFormat.csv:
            typer.echo(frame.to_csv(index=False), nl=False)
        elif format is ReportFormat.json:
            typer.echo(frame.to_json(orient="records", date_format="iso", indent=2))
        else:
            from rich.table import Table

            columns = {
                "name": "experiment" if runs else "configuration",
                "status": "status",
                "zero_stage": "stage",
                "micro_batch_size": "micro",
                "gradient_accumulation_steps": "accum",
                chosen.value: chosen.label if runs else f"{chosen.label}, median",
                **(
                    {"latency_spread": "step spread"}
                    if runs
                    else {"runs": "runs", "spread": "run spread"}
                ),
                **(
                    {"disturbed_runs": "disturbed"}
                    if not runs and frame.get("disturbed_runs", frame["name"] == "").any()
                    else {}
                ),
                PEAK_MEMORY_COLUMN: PEAK_MEMORY_LABEL,
                "error": "error",
            }
            ran = ", ".join(sorted({str(t) for t in frame["target"].dropna()}))  # what was tuned
            where = f"{results_dir} ({ran})" if ran else str(results_dir)
            what = "experiments" if runs else "configurations"
            table = Table(title=f"{where}: {what} by {chosen.value}")
            for header in columns.values():
                table.add_column(header, no_wrap=header != "error", overflow="fold")
            for _, row in frame[list(columns)].iterrows():
                table.add_row(*(_cell(column, row[column]) for column in columns))
            if not runs and frame["runs"].max() > 1 and (frame["runs"] == 1).any():
                table.caption = (
                    "configurations measured once are listed after those measured again: "
                    "one lucky run is not declared best"
                )
            from autotune.display import output_console

            output_console().print(table)

    @app.command()
    def best(
        results_dir: Annotated[
            Path | None, typer.Argument(help=_RESULTS_DIR_HELP, show_default=False)
        ] = None,
        command: Annotated[
            bool,
            typer.Option("--command", help="The command that trains the tuned script with it."),
        ] = False,
        metric: Annotated[
            Metric | None,
            typer.Option(
                case_sensitive=False,
                help="The best by this metric, as the last run that ranked by it found "
                "(default: the last run's metric).",
            ),
        ] = None,
    ) -> None:
        """Print the path of the best config found (ds_config_optimal.json), or with --command
        the command that trains the tuned script with it (cmd_optimal.txt)."""
        from autotune.results import ResultsDir
        from autotune.results.store import COMMAND_NAME, OPTIMAL_NAME

        results_dir = results_dir or default_results_dir()
        results = ResultsDir(results_dir)
        path = results.optimal_path(metric)
        if path is None and metric is not None and results.optimal_path() is not None:
            raise fail(
                f"{results_dir}: no run there ranked by {metric.value} (run autotune run "
                f"--metric {metric.value} on it: the experiments it measured are kept)"
            )
        if path is None:
            raise fail(f"{results_dir} has no {OPTIMAL_NAME} (has a run finished there?)")
        if not command:
            typer.echo(str(path))
            return
        text = results.optimal_command(metric)
        if text is None:
            raise fail(
                f"{results_dir} has no {COMMAND_NAME}: it tuned a workload, not a script (train "
                f"your script with --deepspeed_config {path})"
            )
        typer.echo(text)


def _cell(column: str, value: Any) -> str:
    if value is None or (isinstance(value, float) and value != value):  # None or NaN
        return ""
    if column == PEAK_MEMORY_COLUMN:
        return format_size(float(value))
    if column in ("latency_spread", "spread"):
        return f"{float(value):.0%}"
    if column in ("runs", "disturbed_runs"):
        return str(int(value))
    return f"{value:.4g}" if isinstance(value, float) else str(value)
