"""The results directory: one folder per experiment, the run's Optuna study, resume.

Layout::

    results_dir/
      fingerprint.json          what was tuned (workload, args, world size, base config, versions)
      study.journal             the run's record: an Optuna study, one trial per experiment
      study.json                where the study is and its name (see autotune.results.study)
      exps/<name>/ds_config.json, spec.json, metrics.json, error.txt
      ds_config_optimal.json    the best config, ready to train with
      summary.json, summary.txt

Every file is written atomically, and the trial's tell is the commit point: an experiment whose
trial finished is never run again; one whose trial is still running (the run was killed) is
run again on resume. An experiment's files are written before its trial is told.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from autotune.accelerate_launch import LAUNCH_CONFIG_NAME
from autotune.experiment import CONFIG_NAME, ExperimentResult, ExperimentSpec, Status
from autotune.metric import Metric
from autotune.results.files import atomic_write_json, atomic_write_text, read_jsonl
from autotune.results.lock import DirectoryLock
from autotune.results.study import JOURNAL_NAME, STUDY_INFO_NAME, RunStudy, StudyError
from autotune.tuner.ranking import Ranked, rank

if TYPE_CHECKING:
    import optuna

# The log of finished experiments that directories written before the study kept; read, and
# moved into the study when such a directory is resumed.
LEGACY_LOG_NAME = "experiments.jsonl"
FINGERPRINT_NAME = "fingerprint.json"
OPTIMAL_NAME = "ds_config_optimal.json"
COMMAND_NAME = "cmd_optimal.txt"  # DeepSpeed's autotuner's name for it
SUMMARY_NAME = "summary.json"
SUMMARY_TEXT_NAME = "summary.txt"
EXPS_DIR = "exps"
# Each metric's answer, as the last run that ranked by it left it:
# optimal/<metric>/ds_config_optimal.json (and cmd_optimal.txt). A run by another metric
# rewrites ds_config_optimal.json; this keeps every metric's.
ANSWERS_DIR = "optimal"


class ResultsDirError(ValueError):
    """The results directory cannot be used as asked (one line, names the directory)."""


@dataclass(frozen=True)
class Proposal:
    """How the tuner proposed an experiment, as its record keeps it (the keys ``proposed``,
    ``phase``, ``repeat_of``): read through :meth:`of`, never by key.

    Attributes:
        number: its place in the order the tuner proposed experiments (a resumed run replays
            the log in it).
        phase: the tuner phase that proposed it (``max_micro_batch``, ``model``, ...).
        repeat_of: for a re-measurement, the configuration it measures again.
    """

    number: int
    phase: str
    repeat_of: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"proposed": self.number, "phase": self.phase, "repeat_of": self.repeat_of}

    @classmethod
    def of(cls, record: Mapping[str, Any]) -> Proposal | None:
        """The proposal a record carries (None: a record without one)."""
        if "proposed" not in record:
            return None
        return cls(int(record["proposed"]), str(record["phase"]), record.get("repeat_of"))


class ResultsDir:
    """Reads and writes one results directory.

    Example:
        >>> import tempfile
        >>> from autotune.experiment import CONFIG_NAME, ExperimentResult, ExperimentSpec, Status
        >>> spec = ExperimentSpec("z1_mbs64", {"zero_optimization": {"stage": 1}}, "gpt", {},
        ...     world_size=2, start_profile_step=3, end_profile_step=5, timeout_s=600, seed=0,
        ...     cpus_per_rank=1)
        >>> result = ExperimentResult("z1_mbs64", Status.oom, error="OutOfMemoryError: ...")
        >>> fingerprint = {"tuned": {"workload": "gpt", "world_size": 2}}
        >>> with tempfile.TemporaryDirectory() as path:
        ...     with ResultsDir.open(path, fingerprint) as results:
        ...         folder = results.save(spec, result)  # its files; the study commits it
        ...         sorted(p.name for p in folder.iterdir()), results.optimal_path()
        (['ds_config.json', 'metrics.json', 'spec.json'], None)
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._lock = DirectoryLock(self.path)
        self.run_study = RunStudy(self.path)

    # --- opening ---------------------------------------------------------------------------

    @classmethod
    def open(
        cls, path: str | Path, fingerprint: Mapping[str, Any], overwrite: bool = False
    ) -> ResultsDir:
        """Open ``path`` for a run: create it, or resume it if it holds the same tuning job.

        Args:
            path: the directory.
            fingerprint: what is being tuned; its ``"tuned"`` entry must match a previous
                run's for the directory to be resumed (``"versions"`` may differ).
            overwrite: start afresh, deleting a previous run's results.

        Raises:
            ResultsDirError: the directory is not writable, or holds a different job.
            ResultsLockedError: another live run holds it.
        """
        results = cls(path)
        try:
            results.path.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            raise ResultsDirError(f"cannot create results directory {path}: {err}") from None
        if not _writable(results.path):
            raise ResultsDirError(f"results directory {path} is not writable")
        results._lock.acquire()
        try:
            results._prepare(dict(fingerprint), overwrite)
        except BaseException:
            results._lock.release()
            raise
        return results

    @classmethod
    def check(
        cls, path: str | Path, fingerprint: Mapping[str, Any], overwrite: bool = False
    ) -> None:
        """Raise what :meth:`open` would, without creating the directory or writing any
        result: for a run to refuse a directory before it starts its workers.

        Raises:
            ResultsDirError: the path is a file, or the directory holds a different job.
            ResultsLockedError: another live run holds it.
        """
        cls.check_path(path)
        results = cls(path)
        if not results.path.exists():
            return
        results._lock.acquire()
        try:
            if not overwrite:
                results._refuse_another_job(dict(fingerprint))
        finally:
            results._lock.release()

    @staticmethod
    def check_path(path: str | Path) -> None:
        """Raise where ``path`` cannot hold a results directory (a file; not writable, or not
        creatable), reading nothing in it: what a run refuses in a moment, before it builds
        its workload or starts anything.

        Raises:
            ResultsDirError: it cannot.
        """
        folder = Path(path)
        if folder.exists() and not folder.is_dir():
            raise ResultsDirError(f"results directory {path} is a file, not a directory")
        if not folder.exists():
            ancestor = next(p for p in folder.absolute().parents if p.exists())
            if not ancestor.is_dir() or not os.access(ancestor, os.W_OK | os.X_OK):
                raise ResultsDirError(
                    f"cannot create results directory {path}: {ancestor} is not a writable "
                    "directory"
                )
        elif not _writable(folder):
            raise ResultsDirError(f"results directory {path} is not writable")

    def _prepare(self, fingerprint: dict[str, Any], overwrite: bool) -> None:
        if overwrite:
            self.clear()
        else:
            self._refuse_another_job(fingerprint)
        if not (self.path / FINGERPRINT_NAME).exists():
            atomic_write_json(self.path / FINGERPRINT_NAME, fingerprint)

    def _refuse_another_job(self, fingerprint: Mapping[str, Any]) -> None:
        stored_path = self.path / FINGERPRINT_NAME
        if stored_path.exists():
            stored = json.loads(stored_path.read_text(encoding="utf-8"))
            differing = _differences(stored.get("tuned", {}), fingerprint.get("tuned", {}))
            if differing:
                raise ResultsDirError(
                    f"{self.path} holds results of a different tuning job (differs in: "
                    f"{'; '.join(differing)}); use another --results-dir or --overwrite"
                )
        elif self.run_study.exists() or (self.path / LEGACY_LOG_NAME).exists():
            raise ResultsDirError(
                f"{self.path} has experiments but no {FINGERPRINT_NAME}; "
                "use another --results-dir or --overwrite"
            )

    def clear(self) -> None:
        """Delete everything a previous run wrote, its study too (the lock stays)."""
        self.run_study.delete()
        for name in (
            LEGACY_LOG_NAME,
            FINGERPRINT_NAME,
            OPTIMAL_NAME,
            COMMAND_NAME,
            LAUNCH_CONFIG_NAME,
            SUMMARY_NAME,
            SUMMARY_TEXT_NAME,
        ):
            (self.path / name).unlink(missing_ok=True)
        shutil.rmtree(self.path / EXPS_DIR, ignore_errors=True)
        shutil.rmtree(self.path / ANSWERS_DIR, ignore_errors=True)

    def close(self) -> None:
        self._lock.release()

    def __enter__(self) -> ResultsDir:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # --- experiments -----------------------------------------------------------------------

    def experiment_dir(self, name: str) -> Path:
        return self.path / EXPS_DIR / name

    def study(
        self, metric: Metric, storage: str | None = None, attrs: Mapping[str, Any] | None = None
    ) -> optuna.Study:
        """The run's study for ``metric`` (see :mod:`autotune.results.study`), for a run that
        holds this directory; ``attrs`` are set on a new one (what was tuned). A directory
        from before the study has its experiment log moved into it first.

        Raises:
            ResultsDirError: ``storage`` is not where this directory's study is, or cannot
                be opened.
        """
        fresh = not self.run_study.exists()
        try:
            study = self.run_study.open(metric, storage, attrs or {})
        except StudyError as err:
            raise ResultsDirError(str(err)) from None
        legacy = self.path / LEGACY_LOG_NAME
        if fresh and legacy.exists():
            _import_legacy_log(study, read_jsonl(legacy), metric)
            legacy.rename(legacy.with_suffix(".jsonl.imported"))
        return study

    def start(self, spec: ExperimentSpec) -> Path:
        """Prepare an experiment's folder (its config and spec) before it runs; returns it."""
        folder = self.experiment_dir(spec.name)
        folder.mkdir(parents=True, exist_ok=True)
        atomic_write_json(folder / CONFIG_NAME, dict(spec.config_read))
        atomic_write_json(folder / "spec.json", spec.to_dict())
        return folder

    def save(self, spec: ExperimentSpec, result: ExperimentResult) -> Path:
        """Write a finished experiment's files (``metrics.json``, ``error.txt``); the study's
        trial, told next by the tuner, commits it. Returns its folder."""
        folder = self.experiment_dir(spec.name)
        if not (folder / "spec.json").exists():  # a runner that skipped start()
            self.start(spec)
        atomic_write_json(folder / "metrics.json", result.to_dict())
        if result.error_detail:
            atomic_write_text(folder / "error.txt", result.error_detail + "\n")
        return folder

    def records(self) -> list[dict[str, Any]]:
        """Every finished experiment's record, in the order they finished: the study's
        trials (:func:`autotune.tuner.trials.record_of`), or a directory's log from before
        the study."""
        if self.run_study.exists():
            return self.run_study.records()
        return read_jsonl(self.path / LEGACY_LOG_NAME)

    def results(self) -> list[ExperimentResult]:
        return [ExperimentResult.from_dict(r) for r in self.records()]

    def finished_names(self) -> set[str]:
        return {r["name"] for r in self.records()}

    def is_results_dir(self) -> bool:
        """Whether a run wrote here (its fingerprint, its study, or a log from before it)."""
        return any(
            (self.path / name).exists()
            for name in (FINGERPRINT_NAME, STUDY_INFO_NAME, JOURNAL_NAME, LEGACY_LOG_NAME)
        )

    def ranking(self, metric: Metric) -> list[Ranked]:
        """The run's one ranking by ``metric``: configurations with their repeats folded
        (median, runs, spread over runs), best median first, as the tuner declares them (see
        :func:`autotune.tuner.ranking.rank`)."""
        records = self.records()
        results = [ExperimentResult.from_dict(r) for r in records]
        return rank(results, metric, {r["name"]: r.get("repeat_of") for r in records})

    def ranked_runs(self, metric: Metric) -> list[dict[str, Any]]:
        """Every finished experiment's log record, each by its own measurement: those that
        ran ok best first (re-measurements separately, ties in finishing order), then the
        rest in the order they finished."""
        ok, rest = [], []
        for record in self.records():
            measured = record.get("metrics")
            if record.get("status") == Status.ok.value and measured:
                ok.append((metric.of(measured), record))
            else:
                rest.append(record)
        ok.sort(key=lambda pair: -metric.score(pair[0]))
        return [record for _, record in ok] + rest

    def recorded_metric(self) -> Metric | None:
        """The metric the last run that finished here ranked by (from its summary), or None
        before any run finished."""
        try:
            summary = json.loads((self.path / SUMMARY_NAME).read_text(encoding="utf-8"))
            return Metric(summary["metric"])
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def ranked_metric(self) -> Metric:
        """What the run here ranks by, as ``autotune report`` and the notebook show it: the
        recorded metric, throughput (DeepSpeed's default) before any run finished."""
        return self.recorded_metric() or Metric.throughput

    # --- outputs -----------------------------------------------------------------------------

    def optimal_path(self, metric: Metric | None = None) -> Path | None:
        """The best config the last finished run wrote (``ds_config_optimal.json``); with
        ``metric``, the one the last run that ranked by it wrote. None where there is none."""
        path = self._answer_path(OPTIMAL_NAME, metric)
        return path if path is not None and path.is_file() else None

    def write_optimal(self, ds_config: Mapping[str, Any]) -> Path:
        path = self.path / OPTIMAL_NAME
        atomic_write_json(path, dict(ds_config))
        return path

    def write_command(self, command: str) -> Path:
        """Keep the command that trains with the best config (``cmd_optimal.txt``)."""
        path = self.path / COMMAND_NAME
        atomic_write_text(path, command + "\n")
        return path

    def optimal_command(self, metric: Metric | None = None) -> str | None:
        """The training command the last finished script run wrote (with ``metric``: the
        last that ranked by it), or None."""
        path = self._answer_path(COMMAND_NAME, metric)
        try:
            return path.read_text(encoding="utf-8").strip() if path is not None else None
        except OSError:
            return None

    def _answer_path(self, name: str, metric: Metric | None) -> Path | None:
        """Where ``name`` of ``metric``'s answer is (None: the last run's, at the top)."""
        if metric is None:
            return self.path / name
        kept = self.path / ANSWERS_DIR / metric.value / name
        if kept.exists():
            return kept
        # A directory from before answers were kept by metric: its last run's is the only one.
        return self.path / name if self.recorded_metric() is metric else None

    def write_summary(self, summary: Mapping[str, Any], text: str) -> None:
        """Write the finished run's ``summary.json`` and ``summary.txt``, and keep its answer
        under the metric it ranked by as well (see :data:`ANSWERS_DIR`)."""
        atomic_write_json(self.path / SUMMARY_NAME, dict(summary))
        atomic_write_text(self.path / SUMMARY_TEXT_NAME, text.rstrip() + "\n")
        optimal = self.optimal_path()
        if summary.get("optimal_config") is not None and optimal is not None:
            self._keep_answer(Metric(summary["metric"]), optimal)

    def _keep_answer(self, metric: Metric, optimal: Path) -> None:
        folder = self.path / ANSWERS_DIR / metric.value
        folder.mkdir(parents=True, exist_ok=True)
        kept = folder / OPTIMAL_NAME
        atomic_write_text(kept, optimal.read_text(encoding="utf-8"))
        command = self.optimal_command()
        (folder / COMMAND_NAME).unlink(missing_ok=True)
        if command is not None:
            # The same command, training with the kept copy, which no later run rewrites.
            text = command.replace(str(optimal.resolve()), str(kept.resolve()))
            atomic_write_text(folder / COMMAND_NAME, text + "\n")


def _import_legacy_log(study: optuna.Study, records: list[dict[str, Any]], metric: Metric) -> None:
    """A log from before the study as its trials, in the order the experiments were
    proposed, so that a resumed run replays them as the run that wrote them proposed them."""
    import optuna

    from autotune.tuner.trials import DS_CONFIG_ATTR, PHASE_ATTR, REPEAT_OF_ATTR, state_of

    def number(record: Mapping[str, Any]) -> int:
        proposal = Proposal.of(record)
        return -1 if proposal is None else proposal.number

    for record in sorted(records, key=number):
        result = ExperimentResult.from_dict(record)
        state = state_of(result)
        value = metric.of(result.metrics) if result.metrics is not None else None
        steps = result.stopped_after_steps
        study.add_trial(
            optuna.trial.create_trial(
                state=state,
                value=value if state.name == "COMPLETE" else None,
                intermediate_values={steps: value} if steps and value is not None else None,
                user_attrs={
                    **result.to_dict(),
                    PHASE_ATTR: record.get("phase"),
                    REPEAT_OF_ATTR: record.get("repeat_of"),
                    DS_CONFIG_ATTR: record.get("ds_config") or {},
                },
            )
        )


# What a fingerprint's keys mean to a person, where the key alone does not say it.
_FINGERPRINT_WORDS = {"script.sha256": "the script file's contents", "script.args": "its arguments"}


def _differences(stored: Mapping[str, Any], new: Mapping[str, Any], prefix: str = "") -> list[str]:
    """What differs between two fingerprints' ``tuned`` entries, by dotted key and, where
    short, the values: ``script.args (['--lr', '1'] then ['--lr', '2'])``."""
    found = []
    for key in sorted(set(stored) | set(new)):
        path, old, now = f"{prefix}{key}", stored.get(key), new.get(key)
        if old == now:
            continue
        if isinstance(old, Mapping) and isinstance(now, Mapping) and prefix == "":
            found += _differences(old, now, f"{path}.")
            continue
        said = _FINGERPRINT_WORDS.get(path, path)
        shown = f"{old!r} then {now!r}"
        found.append(f"{said} ({shown})" if len(shown) <= 120 and "sha256" not in path else said)
    return found


def _writable(directory: Path) -> bool:
    probe = directory / ".autotune.write-test"
    try:
        probe.write_text("")
        probe.unlink()
    except OSError:
        return False
    return True
