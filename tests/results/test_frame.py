"""load_results and the plot helpers."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import pytest

from autotune.experiment import Status
from autotune.results import (
    ResultsDir,
    ResultsDirError,
    best_so_far,
    load_results,
    metric_vs_micro_batch,
    pareto_front,
    throughput_vs_memory,
)
from tests.results.records import commit, make_result, make_spec

REQUIRED = [
    "name",
    "status",
    "zero_stage",
    "micro_batch_size",
    "gradient_accumulation_steps",
    "train_batch_size",
    "latency",
    "throughput",
    "flops",
    "peak_memory_bytes",
    "error",
    "started_at",
    "duration_s",
    "node_ids",
    "zero_optimization.reduce_bucket_size",
]


@pytest.fixture
def filled(results: ResultsDir) -> ResultsDir:
    commit(results, make_spec("z1_m2", 1, 2), make_result("z1_m2", throughput=10))
    commit(results, make_spec("z1_m4", 1, 4), make_result("z1_m4", throughput=14))
    commit(results, make_spec("z2_m4", 2, 4), make_result("z2_m4", throughput=12))
    commit(results, make_spec("z2_m8", 2, 8), make_result("z2_m8", Status.oom))
    return results


def test_one_row_per_experiment_with_the_documented_columns(filled: ResultsDir) -> None:
    frame = load_results(filled.path)
    assert list(frame["name"]) == ["z1_m2", "z1_m4", "z2_m4", "z2_m8"]
    assert set(REQUIRED) <= set(frame.columns)
    oom = frame.set_index("name").loc["z2_m8"]
    assert oom["status"] == "oom" and oom["error"] == "RuntimeError: boom"
    ok = frame.set_index("name").loc["z1_m4"]
    assert ok["zero_stage"] == 1 and ok["micro_batch_size"] == 4
    assert ok["throughput"] * ok["latency"] == pytest.approx(ok["train_batch_size"])
    assert ok["zero_optimization.reduce_bucket_size"] == 5 * 10**8
    assert ok["duration_s"] == 6.5 and ok["overhead_s"] == pytest.approx(1.5)
    assert ok["node_ids"] == ("node-a", "node-a")  # where each rank ran
    assert set(frame["target"]) == {"gpt"}  # what ran


def test_not_a_results_directory(tmp_path) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ResultsDirError, match="not an autotune results directory"):
        load_results(tmp_path)


def test_pareto_front_keeps_only_undominated(filled: ResultsDir) -> None:
    frame = load_results(filled.path)
    frame.loc[frame.name == "z1_m2", "peak_memory_bytes"] = 2**29
    assert set(pareto_front(frame)["name"]) == {"z1_m2", "z1_m4"}


def test_plots_draw(filled: ResultsDir) -> None:
    frame = load_results(filled.path)
    assert len(metric_vs_micro_batch(frame).get_lines()) == 2
    assert best_so_far(frame, "latency").get_title() == "best latency so far"
    assert throughput_vs_memory(frame).get_legend() is not None


def test_plots_fold_repeats_into_the_median(results: ResultsDir) -> None:
    commit(results, make_spec("a", 1, 4), make_result("a", throughput=30))
    for index, throughput in enumerate((10, 12), start=1):
        name = f"a_r{index}"
        commit(
            results,
            make_spec(name, 1, 4),
            make_result(name, throughput=throughput),
            repeat_of="a",
        )
    commit(results, make_spec("b", 2, 4), make_result("b", throughput=14))
    front = pareto_front(load_results(results.path))
    assert list(front["name"]) == ["b"]  # a's median (12) no longer beats b


def test_best_so_far_follows_the_declared_best_not_a_lucky_single(results: ResultsDir) -> None:
    commit(results, make_spec("a", 1, 4), make_result("a", throughput=30))  # lucky
    for index, throughput in enumerate((10, 12), start=1):
        name = f"a_r{index}"
        commit(
            results,
            make_spec(name, 1, 4),
            make_result(name, throughput=throughput),
            repeat_of="a",
        )
    ax = best_so_far(load_results(results.path))
    (declared,) = [line for line in ax.get_lines() if line.get_label() == "declared best so far"]
    # 30 while measured once; then the median of 30, 10: 20; then of 30, 10, 12: 12.
    assert list(declared.get_ydata()) == [30, 20, 12]


def test_an_all_failed_directory_draws_its_failures(results: ResultsDir) -> None:
    for name, status in (("a", Status.oom), ("b", Status.error), ("c", Status.timeout)):
        commit(results, make_spec(name, 1, 4), make_result(name, status))
    frame = load_results(results.path)
    for ax in (best_so_far(frame), metric_vs_micro_batch(frame)):
        assert ax.get_title() == "no experiment ran ok"
        assert {t.get_text() for t in ax.get_legend().get_texts()} == {"oom", "error", "timeout"}
    memory = throughput_vs_memory(frame)
    assert "1 oom, 1 error, 1 timeout" in memory.texts[0].get_text()
    assert load_results(results.path, ranked_by="throughput")["runs"].tolist() == [0, 0, 0]
