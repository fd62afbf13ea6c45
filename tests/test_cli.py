"""``autotune validate`` through Typer's runner and as a real process."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from autotune.cli import app
from tests.cli_process import run_autotune

runner = CliRunner()


def test_validate_prints_the_resolved_config(tmp_path: Path) -> None:
    path = tmp_path / "c.json"
    path.write_text(json.dumps({"train_batch_size": 32, "gradient_accumulation_steps": 2}))
    result = runner.invoke(app, ["validate", str(path), "--world-size", "2"])
    assert result.exit_code == 0, result.output
    printed = json.loads(result.stdout)
    assert printed["train_micro_batch_size_per_gpu"] == 8


def test_validate_resolves_the_triad_at_the_world_size_run_defaults_to(tmp_path: Path) -> None:
    # A config checked with validate must resolve as `autotune run` (2 ranks) will run it.
    path = tmp_path / "c.json"
    path.write_text(json.dumps({"train_batch_size": 32, "gradient_accumulation_steps": 2}))
    result = runner.invoke(app, ["validate", str(path)])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["train_micro_batch_size_per_gpu"] == 8


def test_validate_full_shows_defaults(tmp_path: Path) -> None:
    path = tmp_path / "c.json"
    path.write_text("{}")
    result = runner.invoke(app, ["validate", str(path), "--full"])
    assert result.exit_code == 0
    assert json.loads(result.stdout)["autotuning"]["tuner_early_stopping"] == 5


def test_validate_bad_config_exits_2_with_one_line_and_no_traceback(tmp_path: Path) -> None:
    path = tmp_path / "c.json"
    path.write_text('{"zero_optimization": {"stage": 7}}')
    proc = run_autotune("validate", str(path))
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        f"error: {path}: zero_optimization.stage: input should be less than or equal to 3 (got 7)"
    ]
    assert "Traceback" not in proc.stderr


def test_an_unknown_top_level_key_is_one_warning_line(tmp_path: Path) -> None:
    path = tmp_path / "c.json"
    path.write_text('{"cuda_visible_devices": 0, "train_batch_size": 8}')
    proc = run_autotune("validate", str(path))
    assert proc.returncode == 0
    assert proc.stderr.strip().splitlines() == [
        "warning: config key 'cuda_visible_devices' is unknown; kept but not used"
    ]


def test_validate_missing_file_exits_2(tmp_path: Path) -> None:
    result = runner.invoke(app, ["validate", str(tmp_path / "missing.json")])
    assert result.exit_code == 2
    assert "config file not found" in result.stderr


def test_run_exits_1_naming_the_error_when_every_experiment_fails_alike(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A workload (or script) that fails the same way in every config: the run stops after a
    few experiments, records them, and exits non-zero with the error on stderr."""
    import contextlib

    import autotune.cli
    from autotune.experiment import ExperimentResult, ExperimentSpec, Status

    error = "ValueError: the dataset path does not exist"
    ran: list[str] = []

    class Broken:
        def run(self, spec: ExperimentSpec) -> ExperimentResult:
            ran.append(spec.name)
            return ExperimentResult(spec.name, Status.error, error=error)

    monkeypatch.setattr(
        autotune.cli, "_make_runner", lambda *args: contextlib.nullcontext(Broken())
    )
    config = tmp_path / "c.json"
    config.write_text(json.dumps({"autotuning": {"tuner_num_trials": 20}}))
    tiny = ["-a", "n_layer=1", "-a", "d_model=16", "-a", "n_head=2", "-a", "seq_len=8"]
    args = ["run", "-c", str(config), "--results-dir", str(tmp_path / "r"), "-q", *tiny]
    result = runner.invoke(app, args)
    assert result.exit_code == 1, result.output
    assert error in result.stderr and "same error" in result.stderr
    summary = json.loads((tmp_path / "r" / "summary.json").read_text())
    assert summary["num_failed"] == len(ran) < 20 and error in summary["stop_reason"]


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (
            ["run", "--metric", "speed"],
            "error: --metric speed: 'speed' is not one of 'throughput', 'latency', 'flops' "
            "(see autotune run --help)",
        ),
        (
            ["run", "--world-size", "0"],
            "error: --world-size 0: input should be greater than or equal to 1 "
            "(see autotune run --help)",
        ),
        (
            ["run", "-n0"],
            "error: --world-size 0: input should be greater than or equal to 1 "
            "(see autotune run --help)",
        ),
        (
            ["run", "--num-trials=many"],
            "error: --num-trials many: input should be a valid integer, unable to parse string "
            "as an integer (see autotune run --help)",
        ),
        (
            ["report", ".", "--format", "xml"],
            "error: --format xml: 'xml' is not one of 'table', 'csv', 'json' "
            "(see autotune report --help)",
        ),
        (["validate"], "error: missing argument 'config' (see autotune validate --help)"),
        (["rn"], "error: no such command 'rn'. Did you mean 'run'? (see autotune --help)"),
        # Checked before torchrun starts, not a traceback from each rank and torchrun.
        (["exec", "-n", "2", "--", "nosuch.py"], "error: script 'nosuch.py' does not exist"),
        # A size the shell split in two: the unit is not a script to tune.
        *(
            (
                [command, *server, "--device-memory", "16", "GB"],
                "error: --device-memory 16 GB: a size is one word, 16GB (or quoted: '16 GB')",
            )
            for command, server in (("run", []), ("submit", ["--server", "http://127.0.0.1:9"]))
        ),
    ],
)
def test_a_bad_flag_value_or_command_is_one_line_naming_it(args: list[str], line: str) -> None:
    result = runner.invoke(app, args)
    assert result.exit_code == 2
    assert result.stderr.splitlines() == [line]


def test_run_names_the_config_file_of_a_bad_key_as_validate_does(tmp_path: Path) -> None:
    path = tmp_path / "bad.json"
    path.write_text('{"zero_optimization": {"stagee": 1}}')
    validated = runner.invoke(app, ["validate", str(path)])
    ran = runner.invoke(app, ["run", "-c", str(path), "--results-dir", str(tmp_path / "r")])
    assert ran.exit_code == validated.exit_code == 2
    assert (
        ran.stderr.splitlines()
        == validated.stderr.splitlines()
        == [f"error: {path}: zero_optimization.stagee: unknown key; did you mean 'stage'?"]
    )


def test_a_flag_that_breaks_a_config_rule_is_named_instead_of_the_file(tmp_path: Path) -> None:
    path = tmp_path / "ok.json"
    path.write_text('{"zero_optimization": {"stage": 1}}')
    ran = runner.invoke(app, ["run", "-c", str(path), "--time-budget", "-5"])
    assert ran.exit_code == 2
    assert ran.stderr.splitlines() == ["error: --time-budget -5.0: input should be greater than 0"]
    # A rule only the config knows: which flag set the value it breaks.
    window = ["--start-profile-step", "6", "--end-profile-step", "5"]
    ran = runner.invoke(app, ["run", "-c", str(path), *window])
    assert ran.exit_code == 2 and len(ran.stderr.splitlines()) == 1
    assert ran.stderr.startswith("error: --end-profile-step 5: autotuning.end_profile_step")


def test_report_and_best_default_to_the_directory_run_defaults_to(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from autotune.results import ResultsDir
    from tests.results.records import FINGERPRINT, commit, make_result, make_spec

    monkeypatch.chdir(tmp_path)
    with ResultsDir.open("autotuning_results", FINGERPRINT) as results:
        commit(results, make_spec("z1_mbs4"), make_result("z1_mbs4", throughput=12.0))
        optimal = results.write_optimal({"train_micro_batch_size_per_gpu": 4})
    reported = runner.invoke(app, ["report", "-f", "json"])
    assert reported.exit_code == 0, reported.output
    assert [row["name"] for row in json.loads(reported.stdout)] == ["z1_mbs4"]
    best = runner.invoke(app, ["best"])
    assert best.exit_code == 0 and best.stdout.strip() == str(optimal)
    # The example config tunes into the same directory.
    example = Path(__file__).parents[1] / "configs" / "autotune_gpt.json"
    assert json.loads(example.read_text())["autotuning"]["results_dir"] == "autotuning_results"


def test_an_interrupted_run_says_what_it_kept_and_where(tmp_path: Path) -> None:
    from autotune.cli import interrupted_line
    from autotune.results import ResultsDir

    results = tmp_path / "results"
    # Before the run made its directory: no folder to name.
    assert (
        interrupted_line(results) == "interrupted before the first experiment: nothing was written"
    )
    with ResultsDir.open(results, {"tuned": {"workload": "gpt"}}):
        pass
    assert interrupted_line(results) == (
        f"interrupted: 0 finished experiments kept in {results}; run the same command to resume"
    )


def test_help_at_80_columns_shows_every_flag_whole() -> None:
    import typer

    group = typer.main.get_command(app)
    for name, command in group.commands.items():  # type: ignore[attr-defined]
        result = runner.invoke(app, [name, "--help"], env={"COLUMNS": "80"})
        assert result.exit_code == 0, result.output
        flags = re.findall(r"--[a-z][a-z-]*", result.stdout)
        assert "…" not in result.stdout, result.stdout
        for param in command.params:
            for flag in [*param.opts, *param.secondary_opts]:
                if flag.startswith("--"):
                    assert flag in flags, f"{name} --help at 80 columns: {flag} not whole"
