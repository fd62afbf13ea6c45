"""Learning the model's size mid-run (script mode: its experiments measure it): nothing
already run is lost, and a run resumed with the size known from the start decides as the run
that learnt it did."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import pytest

from autotune.config import load_config
from autotune.experiment import ExperimentResult, Metrics, Status
from autotune.profiling.model_info import ModelInfo
from autotune.summary_text import not_run_texts
from autotune.tuner import Candidate, Tuner
from tests.tuner.landscape import MODEL, Landscape, run_until_killed
from tests.tuner.tuners import small_config

BUDGET = 1 << 30
# The estimate says stage 0's model states (0.92 GiB) exceed the 0.90 GiB usable of 1 GiB.
LARGE = ModelInfo(
    num_params=62_000_000,
    param_bytes=4 * 62_000_000,
    activation_bytes_per_sample=1_000_000,
    flops_per_sample=1e9,
)


def stage_0_runs_fastest(candidate: Candidate) -> ExperimentResult:
    """Stage 0 fits after all, and beats stage 1; above 32 samples nothing fits. Each ok
    result measures the model's size, as a script's experiments do."""
    if candidate.micro_batch_size > 32:
        return ExperimentResult(candidate.name, Status.oom, error="OutOfMemoryError")
    step_s = (0.1 if candidate.stage == 0 else 0.4) * (1 + 0.01 * candidate.micro_batch_size)
    metrics = Metrics.from_window([step_s], 2 * candidate.micro_batch_size, 1e9, 1)
    return ExperimentResult(candidate.name, Status.ok, measuring(metrics, LARGE))


def measuring(metrics: Metrics, model: ModelInfo) -> Metrics:
    """``metrics`` as a script's experiment reports them: with the model's size."""
    return replace(
        metrics,
        num_params=model.num_params,
        param_bytes=model.param_bytes,
        activation_bytes_per_sample=model.activation_bytes_per_sample,
    )


def test_what_ran_before_the_model_was_known_is_ranked_and_can_win() -> None:
    config = load_config(
        {
            "zero_optimization": {"stage": [0, 1]},
            "autotuning": {
                "tuner_type": "gridsearch",
                "max_train_micro_batch_size_per_gpu": 32,
                "num_remeasure": 1,
            },
        },
        world_size=2,
    )
    tuner = Tuner(config, device_memory_bytes=BUDGET)
    first, second = tuner.ask(), tuner.ask()  # two in flight, both chosen blind
    assert first is not None and second is not None
    assert (first.name, second.name) == ("z0_mbs32", "z1_mbs32")
    tuner.tell(stage_0_runs_fastest(first))  # the model's size is known from here on
    tuner.tell(stage_0_runs_fastest(second))  # still in flight when the model was learnt
    rest = drive_with(tuner, stage_0_runs_fastest)

    summary = tuner.summary()
    assert "z0" in not_run_texts(summary)  # the estimate prunes stage 0 from here on...
    assert not any(c.stage == 0 and c.repeat_of is None for c in rest), rest
    assert summary.num_run == 2 + len(rest)
    # ...but what it measured stands: ranked, re-measured, the best, the optimal config.
    assert [r.name for r in summary.ranking][:2] == ["z0_mbs32", "z1_mbs32"]
    assert "z0_mbs32_r1" in [c.name for c in rest]
    assert summary.best is not None and summary.best.name == "z0_mbs32"
    assert summary.best_per_variant["z0"].name == "z0_mbs32"
    optimal = tuner.optimal_config()
    assert optimal is not None and optimal["zero_optimization"]["stage"] == 0
    assert optimal["train_micro_batch_size_per_gpu"] == 32


def test_a_result_told_from_history_is_ranked_when_the_model_is_known_from_the_start() -> None:
    """A resumed script run knows the model from its log: the blind first experiment that
    the estimate now prunes is still recognised, counted and ranked."""
    config = load_config(
        {"zero_optimization": {"stage": [0, 1]}, "autotuning": {"num_remeasure": 0}},
        world_size=2,
    )
    resumed = Tuner(config, LARGE, device_memory_bytes=BUDGET)
    blind = {"zero_optimization.stage": 0, "train_micro_batch_size_per_gpu": 32}
    resumed.tell(stage_0_runs_fastest(Candidate("z0_mbs32", blind, {}, resumed.phase)))
    summary = resumed.summary()
    assert "z0" in not_run_texts(summary)
    assert [r.name for r in summary.ranking] == ["z0_mbs32"] and summary.num_run == 1


class MeasuringLandscape(Landscape):
    """The landscape, as a script's experiments report it: an ok result carries the model's
    size."""

    def run(self, candidate: Candidate) -> ExperimentResult:
        result = super().run(candidate)
        if result.metrics is None:
            return result
        return replace(result, metrics=measuring(result.metrics, MODEL))


def drive_with(tuner: Tuner, run: Callable[[Candidate], ExperimentResult]) -> list[Candidate]:
    """Run the tuner to the end, one experiment at a time; the candidates in the order asked."""
    asked = []
    while (candidate := tuner.ask()) is not None:
        asked.append(candidate)
        tuner.tell(run(candidate))
    return asked


@pytest.mark.parametrize("tuner_type", ["gridsearch", "random"])
@pytest.mark.parametrize("interrupt_after", [1, 3, 7])
def test_a_resumed_script_run_decides_as_the_interrupted_one_would_have(
    tuner_type: str, interrupt_after: int
) -> None:
    """Three in flight from the first ask (no waiting for the model); killed; resumed with
    the model known from the log: the cut-off experiments run first (even those chosen
    before the model was known), then exactly what the interrupted run would have run."""
    landscape = MeasuringLandscape(noise=0.05)
    settings = {"tuner_early_stopping": 3, "tuner_num_trials": 14, "num_remeasure": 2}
    budget = landscape.budget_bytes
    for seed in range(2):
        first = Tuner(small_config(tuner_type, **settings), device_memory_bytes=budget)
        killed = run_until_killed(first, landscape, interrupt_after, seed)
        infos = (ModelInfo.from_metrics(r.metrics, 2) for r in killed.finished.values())
        info = next((i for i in infos if i is not None), None)  # tune()'s measured_model_info

        # Not interrupted: the ones in flight finish (in proposal order), then one at a time.
        cut_off = [n for n in killed.proposed if n in killed.in_flight]
        for name in cut_off:
            first.tell(landscape.run(killed.in_flight[name]))
        continued = [c.name for c in drive_with(first, landscape.run)]

        resumed = killed.resumed(
            Tuner, small_config(tuner_type, **settings), info, device_memory_bytes=budget
        )
        rest = [c.name for c in drive_with(resumed, landscape.run)]
        assert rest == cut_off + continued, (seed, killed.proposed, list(killed.finished))
        assert resumed.summary().ranking == first.summary().ranking
