"""``autotune plan``: the predicted ranking of a search space on hardware not at hand, as a
JSON list a program reads and a table a person reads; bad input is one line and exit 2."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from autotune.cli import app
from autotune.tuner.hardware import CATALOG, load_hardware

runner = CliRunner()
FIELDS = {
    "name",
    "zero_stage",
    "micro_batch_size",
    "gradient_accumulation_steps",
    "offload",
    "throughput",
    "latency",
    "memory_bytes",
    "fits",
}
CONFIG = {
    "fp16": {"enabled": True},
    "optimizer": {"type": "AdamW", "params": {"lr": 1e-4}},
    "zero_optimization": {"stage": "all"},
    "autotuning": {"max_train_micro_batch_size_per_gpu": 64},
}


def finished_run(
    tmp_path: Path,
    cost_model: dict[str, Any],
    workload: str,
    world_size: int,
    args: dict[str, Any] | None = None,
    memory_bytes: int | None = None,
) -> Path:
    """A finished model_based run's directory, as far as plan reads it: what it tuned
    (``fingerprint.json``) and the constants it fitted (``summary.json``)."""
    run = tmp_path / "run"
    run.mkdir()
    base = {k: v for k, v in CONFIG.items() if k != "autotuning"}
    tuned = {
        "workload": workload,
        "workload_args": args or {},
        "world_size": world_size,
        "device_memory_bytes": memory_bytes,
        "base_config": base,
    }
    fingerprint = {"tuned": tuned, "autotuning": CONFIG["autotuning"]}
    (run / "fingerprint.json").write_text(json.dumps(fingerprint))
    (run / "summary.json").write_text(json.dumps({"cost_model": cost_model}))
    return run


def plan_json(tmp_path: Path, *args: str) -> list[dict[str, object]]:
    config = tmp_path / "ds.json"
    config.write_text(json.dumps(CONFIG))
    result = runner.invoke(
        app, ["plan", "--config", str(config), "-a", "n_layer=4", "--format", "json", *args]
    )
    assert result.exit_code == 0, result.output
    rows: list[dict[str, object]] = json.loads(result.stdout)
    return rows


def test_the_json_lists_every_configuration_best_first_those_that_fit_before(
    tmp_path: Path,
) -> None:
    rows = plan_json(tmp_path, "--hardware", "a100-80gb", "--world-size", "16")
    assert rows and all(set(row) >= FIELDS for row in rows)
    fits = [row["fits"] for row in rows]
    assert fits == sorted(fits, reverse=True)  # every fitting one before any that does not
    fitting = [row for row in rows if row["fits"]]
    throughputs = [float(row["throughput"]) for row in fitting]  # type: ignore[arg-type]
    assert throughputs == sorted(throughputs, reverse=True)
    assert {row["zero_stage"] for row in rows} == {0, 1, 2, 3}
    for row in rows:  # latency and throughput say the same, at the global batch
        batch = int(row["micro_batch_size"]) * int(row["gradient_accumulation_steps"]) * 16  # type: ignore[call-overload]
        assert float(row["throughput"]) * float(row["latency"]) == pytest.approx(batch)  # type: ignore[arg-type]
    # Each stage's largest fitting micro-batch is listed, and the first that does not fit.
    for stage in range(4):
        sizes = [r for r in rows if r["zero_stage"] == stage]
        assert (
            any(not r["fits"] for r in sizes)
            or max(
                int(r["micro_batch_size"])
                for r in sizes  # type: ignore[call-overload]
            )
            == 64
        )


def test_more_memory_fits_larger_micro_batches_and_sharding_fits_more(tmp_path: Path) -> None:
    def largest(rows: list[dict[str, object]], stage: int) -> int:
        return max(
            int(r["micro_batch_size"])  # type: ignore[call-overload]
            for r in rows
            if r["fits"] and r["zero_stage"] == stage
        )

    big = ("-a", "d_model=2048", "-a", "seq_len=2048")
    small = plan_json(tmp_path, "--hardware", "a100-40gb", *big)
    large = plan_json(tmp_path, "--hardware", "a100-80gb", *big)
    assert largest(large, 0) > largest(small, 0)
    assert largest(small, 3) >= largest(small, 0)


def test_a_hardware_file_with_the_catalog_fields_plans_the_same(tmp_path: Path) -> None:
    path = tmp_path / "mygpu.json"
    path.write_text(json.dumps(CATALOG["h100-80gb"].to_dict()))
    assert load_hardware(str(path)).memory_bytes == CATALOG["h100-80gb"].memory_bytes
    from_file = plan_json(tmp_path, "--hardware", str(path))
    from_catalog = plan_json(tmp_path, "--hardware", "h100-80gb")
    assert [r["name"] for r in from_file] == [r["name"] for r in from_catalog]


def test_a_gpu_no_published_table_measured_is_planned_with_more_doubt(tmp_path: Path) -> None:
    path = tmp_path / "mygpu.json"
    path.write_text(json.dumps({**CATALOG["h100-80gb"].to_dict(), "name": "mygpu"}))
    unknown = plan_json(tmp_path, "--hardware", str(path))[0]
    known = plan_json(tmp_path, "--hardware", "h100-80gb")[0]

    def width(row: dict) -> float:
        return row["throughput_high"] / row["throughput_low"]

    assert width(unknown) > width(known)


@pytest.mark.parametrize(
    ("args", "names"),
    [
        (["--hardware", "tpu-v9"], ["--hardware", "tpu-v9", "v100-32gb"]),
        (["--hardware", "a100-80gb", "--world-size", "12"], ["--world-size", "12", "8"]),
        (["--world-size", "8"], ["--hardware"]),
        (["--from", "nowhere"], ["--from", "summary.json"]),
    ],
)
def test_bad_input_is_one_line_naming_it_and_exit_2(
    tmp_path: Path, args: list[str], names: list[str]
) -> None:
    result = runner.invoke(app, ["plan", *args])
    assert result.exit_code == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.output
    assert all(name in lines[0] for name in names), lines[0]


def test_bad_hardware_files_name_the_problem(tmp_path: Path) -> None:
    missing = tmp_path / "partial.json"
    missing.write_text(json.dumps({"peak_flops": {"fp32": 1e12}}))
    result = runner.invoke(app, ["plan", "--hardware", str(missing)])
    assert result.exit_code == 2 and "missing memory_bytes" in result.stderr


def test_the_table_is_for_a_person(tmp_path: Path) -> None:
    result = runner.invoke(app, ["plan", "--hardware", "v100-32gb", "--top", "3"])
    assert result.exit_code == 0, result.output
    assert "a prediction, not a measurement" in result.stdout
    assert "z" in result.stdout and "yes" in result.stdout


def test_from_a_finished_run_predicts_with_its_fitted_constants(tmp_path: Path) -> None:
    from autotune.tuner.cost_model import CostModel, Topology, prior_for

    prior = prior_for(CATALOG["a100-80gb"], Topology(8, 8, "fp16"))
    fitted = CostModel.from_prior(prior)
    slower = fitted.to_dict()
    slower["u"][0] -= 1.0  # this run's compute was e times slower than the datasheet's
    run = finished_run(tmp_path, slower, workload="gpt", world_size=8)
    datasheet = plan_json(tmp_path, "--hardware", "a100-80gb")
    measured = plan_json(tmp_path, "--from", str(run))  # the run's hardware: a100-80gb
    by_name = {r["name"]: float(r["throughput"]) for r in datasheet}  # type: ignore[arg-type]
    assert all(float(r["throughput"]) < by_name[str(r["name"])] for r in measured)  # type: ignore[arg-type]

    (run / "summary.json").write_text(json.dumps({"cost_model": None}))
    result = runner.invoke(app, ["plan", "--from", str(run)])
    assert result.exit_code == 2 and "not model_based" in result.stderr


def test_with_checkpointing_listed_the_plan_says_what_fits_both_ways(tmp_path: Path) -> None:
    config = tmp_path / "ds.json"
    config.write_text(
        json.dumps(
            {
                **CONFIG,
                "zero_optimization": {"stage": 3},
                "activation_checkpointing": {"enabled": [False, True]},
                "autotuning": {"max_train_micro_batch_size_per_gpu": 4096},
            }
        )
    )
    args = ["-a", "n_layer=8", "-a", "d_model=1024", "-a", "n_head=16", "-a", "seq_len=2048"]
    result = runner.invoke(
        app,
        ["plan", "--config", str(config), *args, "--hardware", "a100-40gb", "--format", "json"],
    )
    assert result.exit_code == 0, result.output
    rows = json.loads(result.stdout)

    def largest(checkpointed: bool) -> int:
        return max(
            r["micro_batch_size"]
            for r in rows
            if r["fits"] and r["activation_checkpointing"] is checkpointed
        )

    assert largest(True) > 2 * largest(False)
    # At the same micro-batch the recompute only costs.
    plain = {r["micro_batch_size"]: r for r in rows if not r["activation_checkpointing"]}
    for row in rows:
        same = plain.get(row["micro_batch_size"])
        if row["activation_checkpointing"] and same is not None:
            assert row["throughput"] < same["throughput"]


def test_a_run_that_measured_a_variant_narrows_its_interval(tmp_path: Path) -> None:
    import torch

    from autotune.profiling.model_info import model_info_on_meta
    from autotune.tuner.cost_model import CostModel, Observation, Topology, fit, prior_for
    from autotune.tuner.step_counts import ModelShape, StepShape, step_counts
    from autotune.workloads import resolve_workload

    topology = Topology(8, 8, "fp16")
    prior = prior_for(CATALOG["a100-80gb"], topology)
    with torch.device("meta"):
        workload = resolve_workload("gpt", {"n_layer": 4})
    shape = ModelShape.from_info(model_info_on_meta(workload, "fp16"))
    # A run on a machine 30% slower than the calibration says, measured at stages 1 and 2.
    truth = CostModel.from_prior(prior)
    observations = []
    for stage in (1, 2):
        for micro in (16, 32, 64):
            counts = step_counts(shape, StepShape(stage, micro), topology)
            (predicted,) = truth.predict([counts], [f"z{stage}"])
            observations.append(
                Observation(
                    tuple(counts),
                    1.3 * predicted.latency_s,
                    config=f"z{stage}_{micro}",
                    variant=f"z{stage}",
                )
            )
    run = finished_run(tmp_path, fit(observations, prior).to_dict(), "gpt", 8, {"n_layer": 4})

    def width(rows: list[dict[str, object]], stage: int) -> float:
        row = next(r for r in rows if r["zero_stage"] == stage and r["fits"])
        return float(row["throughput_high"]) / float(row["throughput_low"])  # type: ignore[arg-type]

    datasheet = plan_json(tmp_path, "--hardware", "a100-80gb")
    measured = plan_json(tmp_path, "--from", str(run))
    assert width(measured, 1) < width(datasheet, 1) and width(measured, 2) < width(datasheet, 2)


def test_from_a_run_plans_its_workload_config_and_memory_budget_and_says_so(
    tmp_path: Path,
) -> None:
    from autotune.tuner.cost_model import CostModel, Topology, prior_for
    from autotune.tuner.hardware import CPU_RANK

    fitted = CostModel.from_prior(prior_for(CPU_RANK, Topology(2, 2, "fp16"))).to_dict()
    budget = 64 * 2**20
    run = finished_run(tmp_path, fitted, "mlp", 2, {"d_hidden": 2048}, memory_bytes=budget)
    result = runner.invoke(app, ["plan", "--from", str(run), "--format", "json"])
    assert result.exit_code == 0, result.output
    rows = json.loads(result.stdout)
    # The run's model (an mlp, not the default gpt), at its own budget: a size over it does
    # not fit, whatever the CPU rank's own memory.
    assert all(row["memory_bytes"] <= budget for row in rows if row["fits"])
    assert any(not row["fits"] and row["memory_bytes"] < CPU_RANK.memory_bytes for row in rows)
    assert all(row["gradient_accumulation_steps"] == 1 for row in rows)  # at 2 ranks
    table = runner.invoke(app, ["plan", "--from", str(run)])
    assert table.exit_code == 0, table.output
    lines = table.stdout.splitlines()
    assert lines[0] == (
        f"from {run}: the constants it fitted, its workload, its config, its 2 ranks, its "
        "memory budget of 64.0 MiB per rank"
    )
    assert lines[1].startswith("model: workload mlp (d_hidden=2048), ") and "in fp16" in lines[1]
    assert lines[2].startswith("predicted on 2 x cpu with 64.0 MiB each")
    other = runner.invoke(app, ["plan", "--from", str(run), "--workload", "gpt"])
    assert "the constants it fitted to mlp, not to gpt" in other.stdout.splitlines()[0]


def test_constants_a_cpu_run_fitted_are_not_applied_to_a_gpu(tmp_path: Path) -> None:
    from autotune.tuner.cost_model import CostModel, Topology, prior_for
    from autotune.tuner.hardware import CPU_RANK

    fitted = CostModel.from_prior(prior_for(CPU_RANK, Topology(2, 2, "fp16"))).to_dict()
    run = finished_run(tmp_path, fitted, "mlp", 2, {"d_hidden": 2048})
    result = runner.invoke(
        app, ["plan", "--from", str(run), "--hardware", "h100-80gb", "-f", "json"]
    )
    assert result.exit_code == 0, result.output
    assert result.stderr == (
        f"warning: the constants {run} fitted are cpu's, not h100-80gb's: planned with "
        "h100-80gb's datasheet instead\n"
    )
    # The run's workload, config and world size on the GPU's datasheet: as if planned
    # without the run.
    config = tmp_path / "ds.json"
    config.write_text(json.dumps(CONFIG))
    args = ["--workload", "mlp", "-a", "d_hidden=2048", "--world-size", "2", "-f", "json"]
    datasheet = runner.invoke(
        app, ["plan", "--config", str(config), "--hardware", "h100-80gb", *args]
    )
    assert json.loads(result.stdout) == json.loads(datasheet.stdout)
    table = runner.invoke(app, ["plan", "--from", str(run), "--hardware", "h100-80gb"])
    assert table.stdout.splitlines()[0] == f"from {run}: its workload, its config, its 2 ranks"
    assert "(the datasheet)" in table.stdout


def test_the_table_says_what_it_plans_and_shows_the_leaders(tmp_path: Path) -> None:
    result = runner.invoke(app, ["plan", "--hardware", "h100-80gb"])
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert "model: workload gpt, 5.8M parameters in fp32, sequence length 128" in out
    assert "predicted on 8 x h100-80gb with 80.0 GiB each (the datasheet)" in out
    rows = [line for line in out.splitlines() if line.lstrip().startswith("z")]
    total = len(
        json.loads(runner.invoke(app, ["plan", "--hardware", "h100-80gb", "-f", "json"]).stdout)
    )
    assert len(rows) == 20 < total and f"the best 20 of {total} (--top N for more" in out
    # The built-in config caps the micro-batch at 32, far below what 80 GiB holds.
    assert "note: the micro-batch stops at 32, the config's cap" in out
    tflops = [float(line.split()[5]) for line in rows]
    assert all(value > 0 for value in tflops)


def _sized_model(checkpointed_bytes: int | None = None) -> Any:
    """A 1B-parameter model holding 40 GiB of activations a sample (and
    ``checkpointed_bytes`` with activation checkpointing)."""
    from autotune.profiling.model_info import ModelInfo

    return ModelInfo(
        num_params=10**9,
        param_bytes=2 * 10**9,
        activation_bytes_per_sample=40 * 2**30,
        flops_per_sample=6e9 * 4096,
        checkpointed_activation_bytes_per_sample=checkpointed_bytes,
        recompute_flops_per_sample=2e9 * 4096,
    )


def _plan(config: dict[str, Any], checkpointed_bytes: int | None = None) -> list[Any]:
    from autotune.config import load_config
    from autotune.tuner.plan import plan

    loaded = load_config({"bf16": {"enabled": True}, **config}, 8)
    return plan(loaded, _sized_model(checkpointed_bytes), CATALOG["a100-80gb"], 8)


def test_a_listed_micro_batch_that_does_not_fit_is_a_row_saying_how_far_over() -> None:
    # 2 x 40 GiB of activations: over the 72 GiB an 80 GiB GPU may use at every stage, the
    # optimizer offloaded or not; no size the config did not list stands in for it.
    rows = _plan({"zero_optimization": {"stage": "all"}, "train_micro_batch_size_per_gpu": [2]})
    assert {r.micro_batch_size for r in rows} == {2}
    assert {r.zero_stage for r in rows} == {0, 1, 2, 3}
    assert not any(r.fits for r in rows)
    for row in rows:
        usable = int(0.9 * CATALOG["a100-80gb"].memory_bytes)
        assert row.over_bytes == row.memory_bytes - usable > 0
        assert row.to_dict()["over_bytes"] == row.over_bytes


def test_every_listed_micro_batch_is_a_row_fitting_or_not() -> None:
    rows = _plan({"zero_optimization": {"stage": 3}, "train_micro_batch_size_per_gpu": [1, 2, 4]})
    assert sorted((r.micro_batch_size, r.fits) for r in rows) == [(1, True), (2, False), (4, False)]
    assert all(r.over_bytes == 0 for r in rows if r.fits)


def test_sizes_not_listed_end_at_the_first_that_does_not_fit() -> None:
    rows = _plan({"zero_optimization": {"stage": 3}})
    assert sorted((r.micro_batch_size, r.fits) for r in rows) == [(1, True), (2, False)]


def test_checkpointing_both_ways_keeps_the_variant_that_does_not_fit_without_it() -> None:
    rows = _plan(
        {
            "zero_optimization": {"stage": 3},
            "train_micro_batch_size_per_gpu": [2],
            "activation_checkpointing": {"enabled": [False, True]},
        },
        checkpointed_bytes=2 * 2**30,
    )
    by_checkpointing = {r.activation_checkpointing: r for r in rows}
    assert len(rows) == 2 and by_checkpointing[True].fits
    assert not by_checkpointing[False].fits and by_checkpointing[False].micro_batch_size == 2


def test_the_table_says_how_far_a_configuration_is_over(tmp_path: Path) -> None:
    config = tmp_path / "ds.json"
    config.write_text(json.dumps({**CONFIG, "train_micro_batch_size_per_gpu": [4096]}))
    result = runner.invoke(app, ["plan", "--config", str(config), "--hardware", "v100-32gb"])
    assert result.exit_code == 0, result.output
    assert "z0_mbs4096" in result.stdout
    assert "z0_mbs4096 does not fit: " in result.stdout and " it may use" in result.stdout


LLAMA = {
    "hidden_size": 256,
    "intermediate_size": 688,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "vocab_size": 1024,
    "seq_len": 256,
    "attn_implementation": "sdpa",
}


def test_a_llama_plans_with_checkpointing_both_ways() -> None:
    pytest.importorskip("transformers")
    from autotune.planning import PlanRequest, make_plan

    config = {
        "bf16": {"enabled": True},
        "zero_optimization": {"stage": 3},
        "train_micro_batch_size_per_gpu": [4, 8],
        "activation_checkpointing": {"enabled": [False, True]},
    }
    planned = make_plan(PlanRequest(config, "hf:llama", LLAMA, 8, hardware="a100-80gb"))
    info = planned.model
    assert info.can_checkpoint
    # Checkpointing keeps each layer's input, not its activations, and runs its forward
    # again in backward.
    assert info.step_bytes(True) < info.step_bytes(False)
    assert 0 < info.recompute_flops_per_sample < info.flops_per_sample
    rows = {(r.micro_batch_size, r.activation_checkpointing): r for r in planned.rows}
    assert set(rows) == {(4, False), (8, False), (4, True), (8, True)}
    for size in (4, 8):
        plain, checkpointed = rows[size, False], rows[size, True]
        assert checkpointed.memory_bytes < plain.memory_bytes
        assert checkpointed.throughput < plain.throughput
