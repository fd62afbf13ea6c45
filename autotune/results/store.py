"""The results directory: one folder per experiment, an append-only log, resume.

Layout::

    results_dir/
      fingerprint.json          what was tuned (workload, args, world size, base config, versions)
      experiments.jsonl         one line per finished experiment, any status, append-only
      exps/<name>/ds_config.json, spec.json, started.json, metrics.json, error.txt
      ds_config_optimal.json    the best config, ready to train with
      summary.json, summary.txt
      study.db                  the model-based tuner's Optuna study

Every file is written atomically, and the log line is the commit point: an experiment whose
line is in the log is finished and is never run again; one without is re-run on resume.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from autotune.experiment import CONFIG_NAME, ExperimentResult, ExperimentSpec, Status
from autotune.metric import Metric
from autotune.results.files import append_line, atomic_write_json, atomic_write_text, read_jsonl
from autotune.results.lock import DirectoryLock
from autotune.tuner.ranking import Ranked, rank

LOG_NAME = "experiments.jsonl"
FINGERPRINT_NAME = "fingerprint.json"
OPTIMAL_NAME = "ds_config_optimal.json"
COMMAND_NAME = "cmd_optimal.txt"  # DeepSpeed's autotuner's name for it
SUMMARY_NAME = "summary.json"
SUMMARY_TEXT_NAME = "summary.txt"
STUDY_NAME = "study.db"
EXPS_DIR = "exps"
STARTED_NAME = "started.json"


class ResultsDirError(ValueError):
    """The results directory cannot be used as asked (one line, names the directory)."""


@dataclass(frozen=True)
class Proposal:
    """How the tuner proposed an experiment, as its log line and ``started.json`` keep it
    (the keys ``proposed``, ``phase``, ``repeat_of``): read through :meth:`of`, never by key.

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
        """The proposal a log line or ``started.json`` carries (None: a line the tuning loop
        did not write, such as a runner's own)."""
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
        ...         results.record(spec, result)  # the log line commits it: never re-run
        ...         sorted(results.finished_names()), results.optimal_path()
        (['z1_mbs64'], None)
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._lock = DirectoryLock(self.path)

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
        results = cls(path)
        if results.path.exists() and not results.path.is_dir():
            raise ResultsDirError(f"results directory {path} is a file, not a directory")
        if not results.path.exists():
            ancestor = next(p for p in results.path.absolute().parents if p.exists())
            if not ancestor.is_dir() or not os.access(ancestor, os.W_OK | os.X_OK):
                raise ResultsDirError(
                    f"cannot create results directory {path}: {ancestor} is not a writable "
                    "directory"
                )
            return
        if not _writable(results.path):
            raise ResultsDirError(f"results directory {path} is not writable")
        results._lock.acquire()
        try:
            if not overwrite:
                results._refuse_another_job(dict(fingerprint))
        finally:
            results._lock.release()

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
        elif (self.path / LOG_NAME).exists():
            raise ResultsDirError(
                f"{self.path} has an experiment log but no {FINGERPRINT_NAME}; "
                "use another --results-dir or --overwrite"
            )

    def clear(self) -> None:
        """Delete everything a previous run wrote (the lock stays)."""
        for name in (
            LOG_NAME,
            FINGERPRINT_NAME,
            OPTIMAL_NAME,
            COMMAND_NAME,
            SUMMARY_NAME,
            SUMMARY_TEXT_NAME,
        ):
            (self.path / name).unlink(missing_ok=True)
        for suffix in ("", "-journal", "-wal", "-shm"):
            (self.path / f"{STUDY_NAME}{suffix}").unlink(missing_ok=True)
        shutil.rmtree(self.path / EXPS_DIR, ignore_errors=True)

    def close(self) -> None:
        self._lock.release()

    def __enter__(self) -> ResultsDir:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # --- experiments -----------------------------------------------------------------------

    def experiment_dir(self, name: str) -> Path:
        return self.path / EXPS_DIR / name

    def start(self, spec: ExperimentSpec, proposal: Proposal | None = None) -> Path:
        """Prepare an experiment's folder (its config) before it runs; returns the folder.

        ``proposal`` is kept as ``started.json`` for :meth:`unfinished`.
        """
        folder = self.experiment_dir(spec.name)
        folder.mkdir(parents=True, exist_ok=True)
        atomic_write_json(folder / CONFIG_NAME, dict(spec.config_read))
        atomic_write_json(folder / "spec.json", spec.to_dict())
        if proposal is not None:
            atomic_write_json(folder / STARTED_NAME, proposal.to_dict())
        return folder

    def unfinished(self) -> dict[str, Proposal]:
        """Experiments started with a proposal but never recorded: running when a run was
        interrupted. By name, the proposal given to :meth:`start`."""
        finished = self.finished_names()
        found = {}
        for path in sorted((self.path / EXPS_DIR).glob(f"*/{STARTED_NAME}")):
            if path.parent.name not in finished:
                proposal = Proposal.of(json.loads(path.read_text(encoding="utf-8")))
                if proposal is not None:
                    found[path.parent.name] = proposal
        return found

    def record(
        self, spec: ExperimentSpec, result: ExperimentResult, proposal: Proposal | None = None
    ) -> None:
        """Store a finished experiment: its files first, then its log line (the commit point),
        with how the tuner proposed it (see :class:`Proposal`)."""
        folder = self.experiment_dir(spec.name)
        if not (folder / "spec.json").exists():  # a runner that skipped start()
            self.start(spec)
        atomic_write_json(folder / "metrics.json", result.to_dict())
        if result.error_detail:
            atomic_write_text(folder / "error.txt", result.error_detail + "\n")
        line = {
            **result.to_dict(),
            "target": spec.target,
            "engine": spec.engine.value,
            "ds_config": dict(spec.ds_config),
            **(proposal.to_dict() if proposal is not None else {}),
        }
        append_line(self.path / LOG_NAME, json.dumps(line, separators=(",", ":")))

    def records(self) -> list[dict[str, Any]]:
        """Every finished experiment's log record, in the order they finished."""
        return read_jsonl(self.path / LOG_NAME)

    def results(self) -> list[ExperimentResult]:
        return [ExperimentResult.from_dict(r) for r in self.records()]

    def finished_names(self) -> set[str]:
        return {r["name"] for r in self.records()}

    def ranking(self, metric: Metric) -> list[Ranked]:
        """The run's one ranking by ``metric``: configurations with their repeats folded
        (median, runs, spread over runs), best median first, as the tuner declares them (see
        :func:`autotune.tuner.ranking.rank`)."""
        return rank(self.results(), metric)

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

    def optimal_path(self) -> Path | None:
        """The best config a finished run wrote (``ds_config_optimal.json``), or None."""
        path = self.path / OPTIMAL_NAME
        return path if path.is_file() else None

    def write_optimal(self, ds_config: Mapping[str, Any]) -> Path:
        path = self.path / OPTIMAL_NAME
        atomic_write_json(path, dict(ds_config))
        return path

    def write_command(self, command: str) -> Path:
        """Keep the command that trains with the best config (``cmd_optimal.txt``)."""
        path = self.path / COMMAND_NAME
        atomic_write_text(path, command + "\n")
        return path

    def optimal_command(self) -> str | None:
        """The training command a finished script run wrote, or None."""
        try:
            return (self.path / COMMAND_NAME).read_text(encoding="utf-8").strip()
        except OSError:
            return None

    def write_summary(self, summary: Mapping[str, Any], text: str) -> None:
        atomic_write_json(self.path / SUMMARY_NAME, dict(summary))
        atomic_write_text(self.path / SUMMARY_TEXT_NAME, text.rstrip() + "\n")

    @property
    def study_url(self) -> str:
        """Where the model-based tuner keeps its Optuna study (SQLite)."""
        return f"sqlite:///{(self.path / STUDY_NAME).resolve()}"


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
