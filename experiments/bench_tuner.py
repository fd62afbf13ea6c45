"""How fast each tuner finds a good config: replayed on measured landscapes, or for real.

**Replay** (the default): every landscape under ``results/landscapes/`` (measured by
``experiments/landscape.py``: every configuration a tuner may ask for, repeated, interleaved),
and GPU-shaped landscapes simulated from the cost model (:mod:`autotune.bench.simulated`:
GPT models of 0.125B to 7B on 8 V100s, A100s or H100s; ``--no-simulated`` leaves them out),
is replayed with each tuner over ``--seeds`` seeds; a :class:`~autotune.bench.table.TableRunner`
answers each experiment with the configuration's measured median times a draw from the
table's own noise. Reported per landscape and tuner: experiments until one within 2% of the
table's best ran (median and 90th percentile over seeds; a run that never got there counts as
never), the share of runs whose final choice is within 2%, and the final choice's median value
as a share of the best.

    python experiments/bench_tuner.py [--seeds 100] [--out results/bench_tuner_replay.json]

``--warm-from TABLE`` adds ``model_based`` warm-started from a replay on another landscape
(the constants it fitted and its answer), as ``autotune serve`` starts a job on hardware an
earlier job tuned: does what one model taught help the next?

**Real** (``--real``): runs the built-in gpt workload at world size 2 over the full
(``fast: false``) space three times, with gridsearch (every point), random and model_based
(each capped at a quarter of the grid's size), and reports for each: experiments and wall time
until it had run a config worth >= 97% of the best one. The yardstick: step times vary up to
±50% run to run, so the grid's single best measurement is mostly the luckiest one. The grid's
top configurations are measured again (round by round) and the best is the one with the
highest median of those repeats; the goal is 97% of that median.

    python experiments/bench_tuner.py --real [--runner ray|local] [--top 3] [--repeats 3]
        [--out results/bench_tuner.json]
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import tempfile
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from autotune.bench.simulated import MODELS, simulated_landscape
from autotune.bench.table import WITHIN, Replay, measured_configs, replay
from autotune.config import Metric, load_config
from autotune.config.sizes import parse_size
from autotune.defaults import DEFAULT_CONFIG, DEFAULT_CPU_DEVICE_MEMORY
from autotune.experiment import ExperimentResult
from autotune.job import TuningJob, experiment_spec
from autotune.tuner import Candidate, Ranked, rank, repeat_name
from autotune.tuner.ranking import relative_noise
from autotune.tuner.warm_start import WarmStart
from autotune.tuning import Runner, TuningEvent, tune

TARGET = 0.97
TUNERS = ("gridsearch", "random", "model_based")
LANDSCAPES = Path(__file__).resolve().parents[1] / "results" / "landscapes"
SIMULATED_HARDWARE = ("v100-32gb", "a100-80gb", "h100-80gb")


@dataclass(frozen=True)
class Yardstick:
    """What the tuners are judged against.

    Attributes:
        grid: each config's grid measurement (samples/s).
        remeasured: the re-measured configs, by the median of their repeats, best first.
        fraction: the share of the best median a tuner must reach.
    """

    grid: Mapping[str, float]
    remeasured: Sequence[Ranked]
    fraction: float = TARGET

    @property
    def best(self) -> Ranked:
        return self.remeasured[0]

    @property
    def goal(self) -> float:
        return self.fraction * self.best.value

    @property
    def worth(self) -> dict[str, float]:
        """Each config's worth: the median of its repeats, else its grid measurement."""
        return {**self.grid, **{r.name: r.value for r in self.remeasured}}

    def to_dict(self) -> dict[str, Any]:
        return {
            "fraction": self.fraction,
            "goal": self.goal,
            "best": self.best.name,
            "best_median": self.best.value,
            "configs": [{**r.to_dict(), "grid": self.grid.get(r.name)} for r in self.remeasured],
        }


def yardstick(
    grid: Mapping[str, float],
    repeats: Iterable[tuple[str, ExperimentResult]],
    fraction: float = TARGET,
) -> Yardstick:
    """The yardstick from the grid's measurements and the re-measurements of its top configs
    (each with the configuration it measured again).

    Only the repeats count towards a median: the grid measurement that put a config on top is
    biased upwards by that very choice.

    Raises:
        ValueError: if no re-measurement ran ok.

    Example:
        >>> from autotune.experiment import Metrics, Status
        >>> def run(config, name, samples_per_s):
        ...     metrics = Metrics.from_window([8 / samples_per_s], 8, 1e9, peak_memory_bytes=0)
        ...     return config, ExperimentResult(name, Status.ok, metrics)
        >>> stick = yardstick({"a": 30.0, "b": 26.0}, [run("a", "a_r1", 25.0),
        ...                   run("b", "b_r1", 26.0), run("a", "a_r2", 24.0)])
        >>> stick.best.name, round(stick.goal, 2), stick.worth
        ('b', 25.22, {'a': 24.5, 'b': 26.0})
    """
    results = [result for _, result in repeats]
    repeat_of = {result.name: config for config, result in repeats}
    remeasured = rank(results, Metric.throughput, repeat_of)
    if not remeasured:
        raise ValueError("no re-measurement of the grid's top configurations ran ok")
    return Yardstick(dict(grid), tuple(remeasured), fraction)


def reach(
    timeline: list[dict[str, Any]], worth: Mapping[str, float], goal: float
) -> dict[str, Any]:
    """Experiments and seconds until a config worth >= goal had been run, and what was run.

    Example:
        >>> timeline = [{"name": "a", "elapsed_s": 5.0}, {"name": "b", "elapsed_s": 9.0}]
        >>> reach(timeline, {"a": 20.0, "b": 25.0}, goal=24.0)["experiments_to_goal"]
        2
    """
    row: dict[str, Any] = {
        "experiments_run": len(timeline),
        "seconds_run": timeline[-1]["elapsed_s"] if timeline else 0.0,
        "reached": False,
        "experiments_to_goal": None,
        "seconds_to_goal": None,
    }
    for index, entry in enumerate(timeline, start=1):
        if worth.get(entry["name"], 0.0) >= goal:
            row.update(reached=True, experiments_to_goal=index, seconds_to_goal=entry["elapsed_s"])
            break
    return row


def make_job(
    tuner_type: str, num_trials: int, results_dir: Path, max_micro_batch: int
) -> TuningJob:
    spec = json.loads(json.dumps(DEFAULT_CONFIG))
    spec["autotuning"].update(
        tuner_type=tuner_type,
        fast=False,
        tuner_num_trials=num_trials,
        tuner_early_stopping=10_000,  # judge the search itself, not when it gives up
        num_remeasure=0,
        results_dir=str(results_dir),
        max_train_micro_batch_size_per_gpu=max_micro_batch,
    )
    return TuningJob(
        config=load_config(spec, world_size=2),
        results_dir=results_dir,
        device_memory_bytes=parse_size(DEFAULT_CPU_DEVICE_MEMORY),
        overwrite=True,
    )


def run_tuner(job: TuningJob, runner: Runner) -> tuple[list[dict[str, Any]], dict[str, Candidate]]:
    """One tuning run: its experiments in order with their finish times, and its candidates."""
    started = time.monotonic()
    timeline: list[dict[str, Any]] = []
    candidates: dict[str, Candidate] = {}

    def record(event: TuningEvent) -> None:
        if event.kind == "finished" and event.result is not None and event.candidate is not None:
            metrics = event.result.metrics
            name = event.candidate.repeat_of or event.candidate.name
            candidates[name] = event.candidate
            timeline.append(
                {
                    "name": name,
                    "status": event.result.status.value,
                    "throughput": metrics.throughput if metrics else None,
                    "elapsed_s": time.monotonic() - started,
                }
            )

    tune(job, runner, on_event=record)
    return timeline, candidates


def remeasure(
    job: TuningJob, candidates: Sequence[Candidate], repeats: int, runner: Runner
) -> list[tuple[str, ExperimentResult]]:
    """Each candidate ``repeats`` times more, round by round (``<name>_r1`` first for all);
    each result with the configuration it measures again."""
    return [
        (
            c.name,
            runner.run(
                experiment_spec(
                    job, replace(c, name=repeat_name(c.name, index), repeat_of=c.name), None
                )
            ),
        )
        for index in range(1, repeats + 1)
        for c in candidates
    ]


def print_report(stick: Yardstick, rows: Mapping[str, Mapping[str, Any]], repeats: int) -> None:
    print(
        f"grid: {len(stick.grid)} configs ran ok; its top {len(stick.remeasured)} re-measured "
        f"{repeats} times each, interleaved (samples/s)"
    )
    print(f"{'config':36s} {'grid':>7s}  {'repeats':24s} {'median':>7s} {'spread':>7s}")
    for r in stick.remeasured:
        values = " ".join(f"{v:.2f}" for v in r.values)
        grid = stick.grid.get(r.name, float("nan"))
        print(f"{r.name:36s} {grid:7.2f}  {values:24s} {r.value:7.2f} {r.spread:7.0%}")
    print(
        f"goal: {stick.fraction:.0%} of {stick.best.value:.2f} (median of {stick.best.name}'s "
        f"repeats) = {stick.goal:.2f} samples/s"
    )
    print(
        f"{'tuner':12s} {'budget':>6s} {'run':>4s} {'wall s':>7s} {'to goal':>8s} {'s to goal':>9s}"
    )
    for name, row in rows.items():
        to_goal, seconds = row["experiments_to_goal"], row["seconds_to_goal"]
        print(
            f"{name:12s} {row['budget']:6d} {row['experiments_run']:4d} {row['seconds_run']:7.0f} "
            f"{to_goal or '-':>8} {'-' if seconds is None else f'{seconds:.0f}':>9}"
        )


def replay_summary(runs: Sequence[Replay]) -> dict[str, Any]:
    """Per tuner: experiments to within 2% (median, p90; None = never), share ending within 2%,
    the final choice's value as a share of the best (median, and p10: what 9 runs in 10 end
    at or above), experiments run (median)."""
    never = float("inf")
    reach = sorted(r.experiments_to(WITHIN) or never for r in runs)
    finals = sorted((r.final or 0.0) / r.best for r in runs)

    def figure(value: float) -> float | None:
        return None if value == never else value

    return {
        "seeds": len(runs),
        "to_within_2pct_median": figure(statistics.median(reach)),
        "to_within_2pct_p90": figure(reach[min(len(reach) - 1, math.ceil(0.9 * len(reach)) - 1)]),
        "ends_within_2pct": sum(r.ends_within(WITHIN) for r in runs) / len(runs),
        "final_value_median": statistics.median(finals),
        "final_value_p10": finals[len(finals) // 10],
        "experiments_run_median": statistics.median(len(r.values) for r in runs),
    }


def replay_landscape(
    table: Mapping[str, Any],
    seeds: Iterable[int],
    warm_from: tuple[str, Mapping[str, Any]] | None = None,
) -> dict[str, dict[str, Any]]:
    """Every tuner over ``seeds`` on one landscape; with ``warm_from`` (a name and another
    table), ``model_based`` warm-started too, as ``autotune serve`` starts a job on hardware
    an earlier job tuned: each seed from what a replay of the other table with that seed
    fitted and answered."""
    seeds = list(seeds)
    rows = {t: replay_summary([replay(table, t, seed) for seed in seeds]) for t in TUNERS}
    if warm_from is not None:
        name, earlier = warm_from
        runs = []
        for seed in seeds:
            before = replay(earlier, "model_based", seed)
            answers = (before.answer,) if before.answer is not None else ()
            warm = WarmStart(cost_model=before.cost_model, answers=answers)
            runs.append(replay(table, "model_based", seed, warm_start=warm))
        rows[f"model_based, warm from {name}"] = replay_summary(runs)
    return rows


def landscape_shape(table: Mapping[str, Any]) -> dict[str, Any]:
    """The table's size, best and median configuration, and how finely it resolves them.

    ``noise``: one measurement's relative spread (pooled over the table's repeats);
    ``best_uncertainty``: how far the best configuration's median may be off by the same
    noise (about 1.25 noise / sqrt(repeats)). Where that exceeds 2%, which configuration is
    within 2% of the best is itself a guess, and so is "ends within 2%".
    ``within_2pct``: configurations within 2% of the best; ``best_margin``: the relative gap
    between the best and the best configuration below the line; ``repeats_to_separate``: how
    many measurements of each of those two a tuner needs to put them in the right order 9
    times in 10 at this noise (the gap against 1.28 standard errors of the difference of two
    medians). A lower bound on what ending within 2% 9 times in 10 costs: a tuner must also
    find the two, and rule out every other configuration near the line.
    """
    measured = measured_configs(table)
    best = measured[0]
    noise = relative_noise(measured) or 0.0
    inside = [r for r in measured if r.value >= WITHIN * best.value]
    below = [r.value for r in measured if r.value < WITHIN * best.value]
    margin = math.log(best.value / max(below)) if below else math.inf
    return {
        "configs": len(table["configs"]),
        "ok": len(measured),
        "best": best.value,
        "best_over_median": best.value / statistics.median(r.value for r in measured),
        "noise": noise,
        "best_uncertainty": 1.25 * noise / math.sqrt(best.num_measurements),
        "within_2pct": len(inside),
        "best_margin": margin,
        "repeats_to_separate": math.ceil(2 * (1.28 * 1.25 * noise / margin) ** 2),
    }


def print_replay(results: Mapping[str, Mapping[str, Any]]) -> None:
    def cell(value: float | None) -> str:
        return "never" if value is None else f"{value:g}"

    print(
        f"{'landscape':24s} {'tuner':12s} {'to 2% med':>9s} {'p90':>6s} {'ends ≤2%':>8s} "
        f"{'final':>6s} {'p10':>6s} {'run':>4s}"
    )
    for name, result in results.items():
        shape = result["shape"]
        print(
            f"{name} ({shape['ok']} ok configs, best {shape['best']:.1f}, "
            f"best/median {shape['best_over_median']:.2f}, one measurement ±{shape['noise']:.1%}, "
            f"best's median ±{shape['best_uncertainty']:.1%}; {shape['within_2pct']} within 2%, "
            f"the best {shape['best_margin']:.1%} above the next below the line: "
            f"{shape['repeats_to_separate']} measurements of each to order them 9 times in 10)"
        )
        for tuner, row in result["tuners"].items():
            print(
                f"{'':24s} {tuner:12s} {cell(row['to_within_2pct_median']):>9s} "
                f"{cell(row['to_within_2pct_p90']):>6s} {row['ends_within_2pct']:8.0%} "
                f"{row['final_value_median']:6.1%} {row['final_value_p10']:6.1%} "
                f"{row['experiments_run_median']:4g}"
            )


def markdown_replay(results: Mapping[str, Mapping[str, Any]]) -> str:
    """The replay as the table in docs/benchmarks.md: one row per landscape, tuners side by side."""

    def reach(row: Mapping[str, Any]) -> str:
        def cell(value: float | None) -> str:
            return "never" if value is None else f"{value:g}"

        median, p90 = row["to_within_2pct_median"], row["to_within_2pct_p90"]
        return f"{cell(median)} / {cell(p90)}"

    head = (
        "| landscape (best/median, noise, best's median ±, within 2%, repeats to separate) "
        "| tuner "
        "| to 2%: median / p90 | ends ≤ 2% | final: median / p10 |"
    )
    lines = [head, "|---|---|---|---|---|"]
    for name, result in results.items():
        shape = result["shape"]
        for tuner, row in result["tuners"].items():
            label = (
                f"{name} ({shape['best_over_median']:.2f}, ±{shape['noise']:.1%}, "
                f"±{shape['best_uncertainty']:.1%}, {shape['within_2pct']}, "
                f"{shape['repeats_to_separate']})"
                if tuner == TUNERS[0]
                else ""
            )
            lines.append(
                f"| {label} | {tuner} | {reach(row)} | {row['ends_within_2pct']:.0%} | "
                f"{row['final_value_median']:.1%} / {row['final_value_p10']:.1%} |"
            )
    return "\n".join(lines)


def main_replay(args: argparse.Namespace) -> None:
    tables = {}
    for path in sorted(args.landscapes.glob("*.json")):
        table = json.loads(path.read_text())
        if not {"how", "configs"} <= set(table):  # e.g. an earlier --out written beside them
            print(f"skipped {path}: not a landscape table (no 'how' and 'configs')")
            continue
        tables[path.stem] = table
    if args.simulated:  # GPU-shaped, beside the measured CPU ones (autotune.bench.simulated)
        for model in MODELS.values():
            for hardware in SIMULATED_HARDWARE:
                tables[f"sim {model.name} 8x{hardware}"] = simulated_landscape(model, hardware)
    warm_from = None
    if args.warm_from is not None:
        warm_from = (args.warm_from.stem, json.loads(args.warm_from.read_text()))
    results = {}
    for name, table in tables.items():
        results[name] = {
            "shape": landscape_shape(table),
            "tuners": replay_landscape(table, range(args.seeds), warm_from),
        }
    print_replay(results)
    print()
    print(markdown_replay(results))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"within": WITHIN, "landscapes": results}, indent=2) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--real", action="store_true", help="run experiments, not a replay")
    parser.add_argument("--seeds", type=int, default=100, help="replay: seeds per landscape")
    parser.add_argument("--landscapes", type=Path, default=LANDSCAPES, help="replay: tables")
    parser.add_argument(
        "--simulated",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="replay: GPU-shaped simulated landscapes too",
    )
    parser.add_argument(
        "--warm-from",
        type=Path,
        help="replay: model_based warm-started from a replay on this table too (its fitted "
        "constants and answer, as the service passes them from an earlier job)",
    )
    parser.add_argument("--runner", choices=["ray", "local"], default="ray")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument(
        "--max-micro-batch", type=int, default=8, help="keeps each experiment to seconds"
    )
    parser.add_argument("--top", type=int, default=3, help="grid configs re-measured")
    parser.add_argument("--repeats", type=int, default=3, help="re-measurements of each")
    args = parser.parse_args()
    if not args.real:
        args.out = args.out or Path("results/bench_tuner_replay.json")
        main_replay(args)
        return
    args.out = args.out or Path("results/bench_tuner.json")
    if args.runner == "ray":
        from autotune.runner.ray_runner import RayRunner

        runner: Any = RayRunner()
    else:
        from autotune.runner import LocalRunner

        runner = LocalRunner()
    rows: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory() as scratch, runner:
        grid_job = make_job("gridsearch", 10_000, Path(scratch) / "grid", args.max_micro_batch)
        grid, candidates = run_tuner(grid_job, runner)
        measured = {e["name"]: e["throughput"] for e in grid if e["throughput"] is not None}
        top = sorted(measured, key=measured.__getitem__, reverse=True)[: args.top]
        repeats = remeasure(grid_job, [candidates[n] for n in top], args.repeats, runner)
        stick = yardstick(measured, repeats)
        rows["gridsearch"] = {"budget": len(grid), **reach(grid, stick.worth, stick.goal)}
        budget = max(1, len(grid) // 4)
        for tuner_type in ("random", "model_based"):
            job = make_job(tuner_type, budget, Path(scratch) / tuner_type, args.max_micro_batch)
            timeline, _ = run_tuner(job, runner)
            rows[tuner_type] = {"budget": budget, **reach(timeline, stick.worth, stick.goal)}

    print_report(stick, rows, args.repeats)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    figures = {
        "grid_size": len(grid),
        "yardstick": {"top": args.top, "repeats": args.repeats, **stick.to_dict()},
        "rows": rows,
        "grid": grid,
        "remeasured": [
            {
                "name": r.name,
                "status": r.status.value,
                "throughput": r.metrics.throughput if r.metrics else None,
            }
            for r in repeats
        ],
    }
    args.out.write_text(json.dumps(figures, indent=2) + "\n")


if __name__ == "__main__":
    main()
