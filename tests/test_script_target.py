"""The torch-free description of a user's script: argv rewriting by arg_mappings, the config
path, the fingerprint."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from autotune.config import load_config
from autotune.experiment import ExperimentResult, ExperimentSpec, Metrics, Status
from autotune.job import TuningJob
from autotune.results import ResultsDir
from autotune.script_target import ScriptError, ScriptTarget
from autotune.summary_text import not_run_texts
from autotune.tuning import tune

MAPPINGS = {"train_micro_batch_size_per_gpu": "--per_device_train_batch_size"}


def target(tmp_path: Path, *args: str, mappings: dict[str, str] | None = None) -> ScriptTarget:
    script = tmp_path / "train.py"
    script.write_text("print('hi')\n")
    return ScriptTarget.from_command(
        [str(script), *args], MAPPINGS if mappings is None else mappings
    )


def test_arg_mappings_rewrite_replace_or_append_the_flag(tmp_path: Path) -> None:
    config = {"train_micro_batch_size_per_gpu": 8, "zero_optimization": {"stage": 2}}
    spaced = target(tmp_path, "--per_device_train_batch_size", "3", "--x", "1")
    assert spaced.argv(config)[1:] == ["--per_device_train_batch_size", "8", "--x", "1"]
    joined = target(tmp_path, "--per_device_train_batch_size=3")
    assert joined.argv(config)[1:] == ["--per_device_train_batch_size=8"]
    assert target(tmp_path).argv(config)[1:] == ["--per_device_train_batch_size", "8"]
    nested = target(tmp_path, mappings={"stage": "--zero_stage"})  # found inside a section
    assert nested.argv(config)[1:] == ["--zero_stage", "2"]
    auto = {"train_micro_batch_size_per_gpu": "auto"}  # left for the script's own default
    assert target(tmp_path, "--x", "1").argv(auto)[1:] == ["--x", "1"]


def test_config_keys_are_trimmed_and_the_script_names_its_config(tmp_path: Path) -> None:
    config = load_config(
        {"autotuning": {"arg_mappings": {" train_micro_batch_size_per_gpu ": " --mbs"}}}, 2
    )
    assert config.autotuning.arg_mappings == {"train_micro_batch_size_per_gpu": "--mbs"}
    assert target(tmp_path, "--deepspeed", "ds.json").config_path() == "ds.json"
    assert target(tmp_path, "--deepspeed_config=c.json").config_path() == "c.json"
    # DeepSpeed's own launch line: --deepspeed is a bare switch there, not the path.
    launch = target(tmp_path, "--deepspeed", "--deepspeed_config", "c.json", "--x", "1")
    assert launch.config_path() == "c.json"
    assert target(tmp_path, "--deepspeed", "--x", "1").config_path() is None


def test_the_fingerprint_changes_with_the_script_file(tmp_path: Path) -> None:
    first = target(tmp_path, "--x", "1").fingerprint()
    (tmp_path / "train.py").write_text("print('changed')\n")
    assert (
        ScriptTarget.from_command([str(tmp_path / "train.py"), "--x", "1"]).fingerprint()["sha256"]
        != first["sha256"]
    )


def test_a_missing_script_or_module_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ScriptError, match="does not exist"):
        ScriptTarget.from_command([str(tmp_path / "nope.py")])
    with pytest.raises(ScriptError, match="cannot be found"):
        ScriptTarget.from_command(["-m", "no_such_module_anywhere"])


def test_cli_refuses_a_script_without_a_config_or_file(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from autotune.cli import app

    script = tmp_path / "train.py"
    script.write_text("print('hi')\n")
    runner = CliRunner()
    no_config = runner.invoke(app, ["run", "--", str(script), "--epochs", "1"])
    assert no_config.exit_code == 2 and "script mode needs a config" in no_config.output
    missing = runner.invoke(app, ["run", "--", str(tmp_path / "nope.py"), "--deepspeed", "x"])
    assert missing.exit_code == 2 and "does not exist" in missing.output


class MeasuringRunner:
    """Stands in for a runner of a script: every experiment is ok and measures a model of
    10M parameters holding 20 MB of activations per sample."""

    def __init__(self) -> None:
        self.names: list[str] = []

    def run(self, spec: ExperimentSpec) -> ExperimentResult:
        self.names.append(spec.name)
        micro = int(spec.ds_config["train_micro_batch_size_per_gpu"])
        metrics = Metrics.from_window([0.1], 2 * micro, 1e9, peak_memory_bytes=1)
        measured = replace(
            metrics,
            num_params=10_000_000,
            param_bytes=40_000_000,
            activation_bytes_per_sample=20_000_000,
        )
        return ExperimentResult(spec.name, Status.ok, measured)


def test_the_first_measured_experiment_gives_the_tuner_the_model_size(tmp_path: Path) -> None:
    config = load_config(
        {
            "zero_optimization": {"stage": [1, 2]},
            "autotuning": {"tuner_type": "gridsearch", "num_remeasure": 0},
        },
        world_size=2,
    )
    job = TuningJob(
        config=config,
        results_dir=tmp_path / "results",
        device_memory_bytes=1 << 30,
        script=target(tmp_path, "--deepspeed", "ds.json"),
    )
    runner = MeasuringRunner()
    tune(job, runner)
    # Nothing is known before the first experiment: it starts at the largest micro-batch.
    # Then the estimate (model states + 20 MB a sample in 1 GiB) starts stage 2 far lower.
    assert runner.names[0] == "z1_mbs1024"
    second_stage = [name for name in runner.names if name.startswith("z2_")]
    assert second_stage and int(second_stage[0].removeprefix("z2_mbs")) < 64, runner.names


def test_the_record_says_the_script_ran_not_a_workload(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from autotune.cli import app
    from autotune.results import load_results

    config = load_config(
        {
            "zero_optimization": {"stage": 1},
            "train_micro_batch_size_per_gpu": [2, 4],
            "autotuning": {"tuner_type": "gridsearch", "num_remeasure": 0},
        },
        world_size=2,
    )
    script = target(tmp_path, "--deepspeed", "ds.json")
    job = TuningJob(config=config, results_dir=tmp_path / "results", script=script)
    tune(job, MeasuringRunner())

    spec = json.loads((job.results_dir / "exps" / "z1_mbs2" / "spec.json").read_text())
    assert spec["workload"] is None and spec["workload_args"] == {}
    assert spec["script"]["path"] == str(tmp_path / "train.py")
    assert ExperimentSpec.from_dict(spec).target == "train.py"
    assert set(load_results(job.results_dir)["target"]) == {"train.py"}
    report = CliRunner().invoke(app, ["report", str(job.results_dir)])
    assert report.exit_code == 0 and "(train.py)" in report.stdout, report.stdout


class ConservativeEstimateRunner:
    """A script whose model (62M parameters) the estimate says cannot fit at stage 0 in
    1 GiB, yet stage 0 runs, fastest: the first experiment (stage 0, chosen before the model
    is known) is the best of the run."""

    def __init__(self) -> None:
        self.names: list[str] = []

    def run(self, spec: ExperimentSpec) -> ExperimentResult:
        self.names.append(spec.name)
        micro = int(spec.ds_config["train_micro_batch_size_per_gpu"])
        if micro > 64:
            return ExperimentResult(spec.name, Status.oom, error="out of memory")
        stage = int(spec.ds_config["zero_optimization"]["stage"])
        step_s = 0.1 if stage == 0 else 0.4
        metrics = Metrics.from_window([step_s], 2 * micro, 1e9, peak_memory_bytes=1)
        measured = replace(
            metrics,
            num_params=62_000_000,
            param_bytes=4 * 62_000_000,
            activation_bytes_per_sample=1_000_000,
        )
        return ExperimentResult(spec.name, Status.ok, measured)


def stage_0_job(tmp_path: Path) -> TuningJob:
    """Stages 0 and 1 of a script, in 1 GiB: what ``ConservativeEstimateRunner`` runs."""
    config = load_config(
        {
            "zero_optimization": {"stage": [0, 1]},
            "autotuning": {
                "tuner_type": "gridsearch",
                "num_remeasure": 1,
                "max_train_micro_batch_size_per_gpu": 64,
            },
        },
        world_size=2,
    )
    return TuningJob(
        config=config,
        results_dir=tmp_path / "results",
        device_memory_bytes=1 << 30,
        script=target(tmp_path, "--deepspeed", "ds.json"),
    )


def test_a_measured_result_the_estimate_would_not_propose_is_still_ranked(
    tmp_path: Path,
) -> None:
    job = stage_0_job(tmp_path)
    runner = ConservativeEstimateRunner()
    report = tune(job, runner)
    # Before the model is known, stage 0 goes first; once it is, the estimate prunes stage 0
    # (model states 0.92 GiB of 0.90 usable) but the measurement stands: ranked, counted,
    # re-measured, declared the best and written as the optimal config.
    assert runner.names[0] == "z0_mbs64"
    summary = report.summary
    assert "z0" in not_run_texts(summary) and summary.num_run == len(runner.names)
    assert summary.ranking[0].name == "z0_mbs64"
    assert summary.best is not None and summary.best.name == "z0_mbs64"
    assert "z0_mbs64_r1" in runner.names
    assert report.optimal_config_path is not None
    optimal = json.loads(report.optimal_config_path.read_text())
    assert optimal["zero_optimization"]["stage"] == 0
    assert optimal["train_micro_batch_size_per_gpu"] == 64


class SideBySide:
    """``ConservativeEstimateRunner`` with room for two experiments, finishing the later one
    first; ``interrupt_after`` results, it raises KeyboardInterrupt (a killed driver)."""

    uses_gpus = True

    def __init__(self, interrupt_after: int = 0) -> None:
        self.script = ConservativeEstimateRunner()
        self.in_flight: list[ExperimentSpec] = []
        self.first_batch: list[str] = []
        self.finished = 0
        self._interrupt_after = interrupt_after

    def capacity(self, world_size: int, cpus_per_rank: int = 1) -> int:
        return 2

    def submit(self, spec: ExperimentSpec) -> None:
        self.in_flight.append(spec)
        if not self.finished:
            self.first_batch.append(spec.name)

    def wait(self) -> list[ExperimentResult]:
        if self._interrupt_after and self.finished == self._interrupt_after:
            raise KeyboardInterrupt
        self.finished += 1
        return [self.script.run(self.in_flight.pop())]

    def cancel(self) -> None:
        self.in_flight.clear()


def test_a_script_run_starts_side_by_side_and_resumes_without_losing_the_blind_ones(
    tmp_path: Path,
) -> None:
    job = stage_0_job(tmp_path)
    killed = SideBySide(interrupt_after=1)
    with pytest.raises(KeyboardInterrupt):
        tune(job, killed)
    # Both first experiments were chosen before the model was measured; z0_mbs64 was cut off.
    assert killed.first_batch == ["z0_mbs64", "z1_mbs64"] and killed.script.names == ["z1_mbs64"]
    resumed = SideBySide()
    report = tune(job, resumed)
    assert resumed.script.names[0] == "z0_mbs64"  # owed: run again first, though now pruned
    log = [record["name"] for record in ResultsDir(job.results_dir).records()]
    assert len(log) == len(set(log)) == report.summary.num_run
    assert report.summary.best is not None and report.summary.best.name == "z0_mbs64"


def test_activation_checkpointing_maps_onto_the_scripts_flag(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text("")
    mapping = {"activation_checkpointing.enabled": "--gradient_checkpointing"}
    target = ScriptTarget.from_command([str(script), "--deepspeed", "ds.json"], mapping)
    on = {"activation_checkpointing": {"enabled": True}}
    assert target.argv(on)[-2:] == ["--gradient_checkpointing", "true"]
    off = {"activation_checkpointing": {"enabled": False}}
    assert target.argv(off)[-2:] == ["--gradient_checkpointing", "false"]


def test_llamafactorys_yaml_names_the_config_and_takes_key_value_overrides(
    tmp_path: Path,
) -> None:
    """LLaMA-Factory's form: a YAML first (``deepspeed: FILE``), then ``key=value``
    overrides; each experiment's file and mapped values are set as overrides, the HF Trainer's
    flag for the micro-batch mapped by default (the accumulation left to the script)."""
    cfg = tmp_path / "sft.yaml"
    cfg.write_text("deepspeed: ds_z2_config.json\nper_device_train_batch_size: 2\n")
    script = tmp_path / "train.py"
    script.write_text("print('hi')\n")
    lf = ScriptTarget.from_command([str(script), str(cfg), "learning_rate=1e-4"])
    assert lf.key_value and lf.config_path() == "ds_z2_config.json"
    lf = lf.with_arg_mappings({})
    config = {"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 1}
    assert lf.argv(config, "exp/ds.json")[1:] == [
        str(cfg), "learning_rate=1e-4", "per_device_train_batch_size=4", "deepspeed=exp/ds.json"
    ]  # fmt: skip
    overridden = ScriptTarget.from_command([str(script), str(cfg), "deepspeed=other.json"])
    assert overridden.config_path() == "other.json"
    printed = lf.command(config, "/r/ds_config_optimal.json", ["autotune", "exec", "--"])
    assert printed[-2:] == ["per_device_train_batch_size=4", "deepspeed=/r/ds_config_optimal.json"]
    # The winner's file keeps the user's "auto" where the Trainer fills it from an override.
    user = {"train_micro_batch_size_per_gpu": "auto", "zero_optimization": {"stage": 2}}
    best = {"train_micro_batch_size_per_gpu": 4, "zero_optimization.stage": 2}
    assert lf.left_to_client(user, best) == {"zero_optimization.stage": 2}
    plain = ScriptTarget.from_command([str(script), "--deepspeed", "ds.json"], MAPPINGS)
    assert plain.left_to_client(user, best) == best  # its client may not fill "auto" in


@pytest.mark.parametrize(
    "launcher",
    [["torchrun", "--nproc_per_node", "2"], ["deepspeed"], ["-m", "torch.distributed.run"]],
)
def test_a_nested_launcher_is_refused_saying_what_to_do(
    tmp_path: Path, launcher: list[str]
) -> None:
    with pytest.raises(ScriptError, match=r"starts the ranks itself.*--world-size N"):
        ScriptTarget.from_command([*launcher, str(tmp_path / "train.py")])
    with pytest.raises(ScriptError, match=r"-m llamafactory\.launcher CONFIG\.yaml"):
        ScriptTarget.from_command(["llamafactory-cli", "train", "sft.yaml"])


def test_force_torchrun_is_refused_for_llamafactorys_form(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg = tmp_path / "sft.yaml"
    cfg.write_text("deepspeed: ds.json\n")
    (tmp_path / "train.py").write_text("print('hi')\n")
    monkeypatch.setenv("FORCE_TORCHRUN", "1")
    with pytest.raises(ScriptError, match=r"FORCE_TORCHRUN is set.*unset it"):
        ScriptTarget.from_command([str(tmp_path / "train.py"), str(cfg)])
