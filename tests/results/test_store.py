"""The results directory: atomic files, the study, resume, fingerprint, lock."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest
from optuna.storages import JournalStorage
from optuna.storages.journal import JournalFileBackend
from optuna.trial import TrialState

from autotune.experiment import Status
from autotune.metric import Metric
from autotune.results import (
    ResultsDir,
    ResultsDirError,
    ResultsLockedError,
    atomic_write_json,
    read_jsonl,
)
from tests.results.records import FINGERPRINT, commit, make_result, make_spec


def test_an_experiment_is_its_folder_and_one_trial_of_the_study(results: ResultsDir) -> None:
    commit(results, make_spec("a"), make_result("a"))
    commit(results, make_spec("b"), make_result("b", Status.oom))
    folder = results.experiment_dir("a")
    assert json.loads((folder / "ds_config.json").read_text())["zero_optimization"]["stage"] == 1
    assert json.loads((folder / "metrics.json").read_text())["status"] == "ok"
    assert [r["name"] for r in results.records()] == ["a", "b"]
    assert results.finished_names() == {"a", "b"}
    assert results.results()[1].status is Status.oom
    assert results.results()[0] == make_result("a")  # every field comes back
    info = json.loads((results.path / "study.json").read_text())
    study = optuna.load_study(
        study_name=info["studies"]["throughput"],
        storage=JournalStorage(JournalFileBackend(str(results.path / "study.journal"))),
    )
    assert [t.state for t in study.trials] == [TrialState.COMPLETE, TrialState.FAIL]
    assert study.trials[0].value == pytest.approx(10.0) and study.trials[1].value is None


def test_a_journal_line_torn_by_a_kill_is_cut_when_the_run_resumes(tmp_path: Path) -> None:
    with ResultsDir.open(tmp_path, FINGERPRINT) as first:
        commit(first, make_spec("a"), make_result("a"))
    with (tmp_path / "study.journal").open("a") as handle:
        handle.write('{"op_code": 5, "worker_id": "x", "trial_id": 1, "user_a')  # cut short
    assert ResultsDir(tmp_path).finished_names() == {"a"}  # readable while torn
    with ResultsDir.open(tmp_path, FINGERPRINT) as resumed:
        commit(resumed, make_spec("c"), make_result("c"))
        assert [r["name"] for r in resumed.records()] == ["a", "c"]


def test_a_copied_directory_resumes_its_study(tmp_path: Path) -> None:
    with ResultsDir.open(tmp_path / "here", FINGERPRINT) as first:
        commit(first, make_spec("a"), make_result("a"))
    shutil.copytree(tmp_path / "here", tmp_path / "there")
    shutil.rmtree(tmp_path / "here")
    with ResultsDir.open(tmp_path / "there", FINGERPRINT) as copied:
        commit(copied, make_spec("b"), make_result("b"))
        assert [r["name"] for r in copied.records()] == ["a", "b"]


def test_another_metric_continues_in_a_study_of_its_own_with_every_trial(
    results: ResultsDir,
) -> None:
    commit(results, make_spec("a"), make_result("a", throughput=8.0))
    latency = results.study(Metric.latency)
    assert latency.direction.name == "MINIMIZE"
    assert [t.value for t in latency.trials] == [pytest.approx(1.0)]  # 8 samples at 8/s
    commit(results, make_spec("b"), make_result("b"), metric=Metric.latency)
    assert [r["name"] for r in results.records()] == ["a", "b"]


def test_a_study_elsewhere_is_refused_on_resume_with_another_storage(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'team.db'}"
    with ResultsDir.open(tmp_path / "run", FINGERPRINT) as first:
        first.study(Metric.throughput, url)
        commit(first, make_spec("a"), make_result("a"))  # no storage given: the recorded one
        assert not (tmp_path / "run" / "study.journal").exists()
    names = optuna.get_all_study_names(url)
    assert len(names) == 1 and len(optuna.load_study(study_name=names[0], storage=url).trials)
    with (
        ResultsDir.open(tmp_path / "run", FINGERPRINT) as resumed,
        pytest.raises(ResultsDirError, match=r"study is in sqlite:///.*team\.db, not"),
    ):
        resumed.study(Metric.throughput, str(tmp_path / "other.journal"))


def test_a_directory_from_before_the_study_is_moved_into_one(tmp_path: Path) -> None:
    (tmp_path / "fingerprint.json").write_text(json.dumps(FINGERPRINT))
    lines = [
        {**make_result("b").to_dict(), "proposed": 1, "phase": "model", "ds_config": {}},
        {**make_result("a").to_dict(), "proposed": 0, "phase": "model", "ds_config": {}},
    ]
    (tmp_path / "experiments.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    assert ResultsDir(tmp_path).finished_names() == {"a", "b"}  # read as it is
    with ResultsDir.open(tmp_path, FINGERPRINT) as resumed:
        study = resumed.study(Metric.throughput)
        assert [t.user_attrs["name"] for t in study.trials] == ["a", "b"]  # proposal order
    assert not (tmp_path / "experiments.jsonl").exists()


def test_a_corrupt_middle_line_is_an_error(tmp_path: Path) -> None:
    log = tmp_path / "log.jsonl"
    log.write_text('{"a": 1}\nnot json\n{"b": 2}\n')
    with pytest.raises(ValueError, match=":2: not a JSON line"):
        read_jsonl(log)


def test_atomic_write_leaves_no_temporary_files(tmp_path: Path) -> None:
    atomic_write_json(tmp_path / "x.json", {"a": 1})
    atomic_write_json(tmp_path / "x.json", {"a": 2})
    assert [p.name for p in tmp_path.iterdir()] == ["x.json"]
    assert json.loads((tmp_path / "x.json").read_text()) == {"a": 2}


def test_reopening_resumes_with_everything_kept(tmp_path: Path) -> None:
    with ResultsDir.open(tmp_path, FINGERPRINT) as first:
        commit(first, make_spec("a"), make_result("a"))
    changed_versions = {**FINGERPRINT, "versions": {"autotune": "1"}}
    with ResultsDir.open(tmp_path, changed_versions) as second:
        assert second.finished_names() == {"a"}


def test_a_different_job_is_refused_not_reused(tmp_path: Path) -> None:
    with ResultsDir.open(tmp_path, FINGERPRINT) as first:
        commit(first, make_spec("a"), make_result("a"))
    other = {"tuned": {"workload": "mlp", "world_size": 2}}
    match = r"different tuning job \(differs in: workload \('gpt' then 'mlp'\)\)"
    with pytest.raises(ResultsDirError, match=match):
        ResultsDir.open(tmp_path, other)
    with pytest.raises(ResultsDirError, match=match):
        ResultsDir.check(tmp_path, other)  # before a run starts anything
    assert ResultsDir(tmp_path).finished_names() == {"a"}  # nothing lost


def test_a_script_job_names_what_of_the_script_differs(tmp_path: Path) -> None:
    def job(args: list[str], sha256: str) -> dict[str, object]:
        script = {"script": "/x/train.py", "args": args, "sha256": sha256}
        return {"tuned": {"script": script, "world_size": 2}}

    with ResultsDir.open(tmp_path, job(["--lr", "1"], "aaa")):
        pass
    with pytest.raises(
        ResultsDirError, match=r"its arguments \(\['--lr', '1'\] then \['--lr', '2'\]\)\)"
    ):
        ResultsDir.check(tmp_path, job(["--lr", "2"], "aaa"))
    with pytest.raises(ResultsDirError, match=r"differs in: the script file's contents\)"):
        ResultsDir.check(tmp_path, job(["--lr", "1"], "bbb"))


def test_a_file_is_no_results_directory(tmp_path: Path) -> None:
    path = tmp_path / "file"
    path.write_text("mine")
    with pytest.raises(ResultsDirError, match="is a file, not a directory"):
        ResultsDir.check(path, FINGERPRINT)
    assert path.read_text() == "mine"


def test_overwrite_starts_afresh(tmp_path: Path) -> None:
    with ResultsDir.open(tmp_path, FINGERPRINT) as first:
        commit(first, make_spec("a"), make_result("a"))
    with ResultsDir.open(tmp_path, {"tuned": {"workload": "mlp"}}, overwrite=True) as second:
        assert second.finished_names() == set()
        assert not second.experiment_dir("a").exists()
        assert not (tmp_path / "study.journal").exists()


def test_unwritable_directory_is_a_clear_error(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(ResultsDirError, match="cannot create results directory"):
        ResultsDir.open(blocker / "run", FINGERPRINT)


def test_a_live_run_keeps_others_out_and_a_dead_ones_lock_is_taken_over(tmp_path: Path) -> None:
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; from autotune.results import ResultsDir;"
            f"ResultsDir.open({str(tmp_path)!r}, {FINGERPRINT!r}); print('held', flush=True);"
            "time.sleep(60)",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        with pytest.raises(ResultsLockedError, match="in use by another autotune run"):
            ResultsDir.open(tmp_path, FINGERPRINT)
    finally:
        holder.kill()  # like kill -9: the lock file stays behind
        holder.wait()
    time.sleep(0.1)
    with ResultsDir.open(tmp_path, FINGERPRINT) as taken_over:
        assert taken_over.finished_names() == set()


def test_ranked_runs_puts_ok_experiments_best_first_by_the_metric_and_failures_last(
    results: ResultsDir,
) -> None:
    for name, status, throughput in (
        ("slow", Status.ok, 5.0),
        ("oom", Status.oom, 0.0),
        ("fast", Status.ok, 20.0),
        ("fast_r1", Status.ok, 10.0),
    ):
        repeat_of = "fast" if name == "fast_r1" else None
        result = make_result(name, status, throughput or 1.0)
        commit(results, make_spec(name), result, repeat_of=repeat_of)
    for metric in Metric:  # a faster step is better by every metric
        assert [r["name"] for r in results.ranked_runs(metric)] == [
            "fast",
            "fast_r1",
            "slow",
            "oom",
        ]
        # The run's ranking folds the repeat: fast's median (15) is still the best.
        assert [(r.name, r.num_measurements) for r in results.ranking(metric)] == [
            ("fast", 2),
            ("slow", 1),
        ]


def test_optimal_path_and_recorded_metric_exist_once_a_run_finished(
    results: ResultsDir,
) -> None:
    assert results.optimal_path() is None and results.recorded_metric() is None
    written = results.write_optimal({"train_micro_batch_size_per_gpu": 4})
    results.write_summary({"metric": "latency"}, "done")
    assert results.optimal_path() == written == results.path / "ds_config_optimal.json"
    assert results.recorded_metric() is Metric.latency


def test_a_scripts_command_is_kept_by_metric_training_with_the_kept_config(
    results: ResultsDir,
) -> None:
    optimal = results.write_optimal({"train_micro_batch_size_per_gpu": 8})
    results.write_command(f"torchrun train.py --deepspeed_config {optimal.resolve()} --steps 9")
    results.write_summary({"metric": "latency", "optimal_config": str(optimal)}, "done")
    kept = results.optimal_path(Metric.latency)
    assert (
        kept is not None
        and kept != optimal
        and json.loads(kept.read_text()) == {"train_micro_batch_size_per_gpu": 8}
    )
    assert results.optimal_command(Metric.latency) == (
        f"torchrun train.py --deepspeed_config {kept.resolve()} --steps 9"
    )
    assert results.optimal_path(Metric.throughput) is None  # no run ranked by it
    results.clear()  # --overwrite: every metric's answer goes too
    assert results.optimal_path(Metric.latency) is None
