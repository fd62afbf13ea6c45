"""Where a results directory's Optuna study lives, and how it is opened and read.

By default the study is an Optuna journal file in the directory, ``study.journal``
(``JournalStorage`` over ``JournalFileBackend``: append-only, fsynced, no server), so a copied
directory takes its study along. ``--storage`` puts it in any storage Optuna takes: a database
URL (``sqlite:///runs/autotune.db``, ``postgresql://...``) or another journal file's path.
``study.json`` says where the study is and under which name, one study per metric the run
was ranked by (a trial's value is that metric): a run resumed with another metric starts
that metric's study from a copy of the last one's trials.

Plain Optuna opens it: ``optuna.load_study(study_name=..., storage=...)`` with the name and
storage ``study.json`` gives, or ``optuna-dashboard <results_dir>/study.journal``.
"""

from __future__ import annotations

import contextlib
import json
import os
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from autotune.metric import Metric
from autotune.results.files import atomic_write_json
from autotune.tuner.trials import SUPERSEDES_ATTR, new_study, record_of

if TYPE_CHECKING:
    import optuna

JOURNAL_NAME = "study.journal"
STUDY_INFO_NAME = "study.json"
# The journal backend's lock file: a run killed while appending leaves it behind.
_JOURNAL_LOCK_SUFFIX = ".lock"


class StudyError(ValueError):
    """The study cannot be opened as asked (one line, names the storage)."""


def is_url(storage: str) -> bool:
    """Whether ``storage`` is a database URL (else it is a journal file's path)."""
    return "://" in storage


class RunStudy:
    """The study of the results directory at ``path`` (see the module docstring).

    Writing (:meth:`open`) needs the directory's lock, which the caller holds; reading does
    not: a run in progress may be read while it writes.
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)

    # --- where it is --------------------------------------------------------------------------

    def info(self) -> dict[str, Any]:
        """``study.json``: ``storage`` (None: the journal file here), ``studies`` (metric →
        study name) and ``current`` (the metric last ranked by); empty before a run."""
        try:
            info = json.loads((self.path / STUDY_INFO_NAME).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return {}
        return info if isinstance(info, dict) else {}

    def storage_description(self) -> str:
        """Where the study is, as a person would pass it to ``optuna-dashboard``."""
        storage = self.info().get("storage")
        return storage if storage else str(self.path / JOURNAL_NAME)

    def exists(self) -> bool:
        return bool(self.info().get("studies"))

    def _storage(self, storage: str | None) -> str | optuna.storages.BaseStorage:
        if storage is not None and is_url(storage):
            return storage
        import optuna
        from optuna.storages.journal import JournalFileBackend

        path = Path(storage) if storage is not None else self.path / JOURNAL_NAME
        if not path.is_absolute() and storage is not None:
            path = Path.cwd() / path
        return optuna.storages.JournalStorage(JournalFileBackend(str(path)))

    # --- opening for a run --------------------------------------------------------------------

    def open(
        self, metric: Metric, storage: str | None, attrs: Mapping[str, Any], seed: int = 0
    ) -> optuna.Study:
        """The run's study for ``metric``, created if need be, in ``storage`` (None: where
        the directory's study is, else the journal file here).

        Raises:
            StudyError: ``storage`` is not where this directory's study is, or Optuna
                cannot open it.
        """
        info = self.info()
        recorded = info.get("storage")
        if info.get("studies") and storage is not None and storage != recorded:
            where = recorded or f"{JOURNAL_NAME} in {self.path}"
            raise StudyError(
                f"{self.path}'s study is in {where}, not {storage}: resume without --storage "
                "(or with the same one), or use another --results-dir"
            )
        storage = storage if storage is not None else recorded
        if storage is None:
            self._repair_journal(self.path / JOURNAL_NAME)
        studies: dict[str, str] = dict(info.get("studies") or {})
        name = studies.get(metric.value)
        try:
            backend = self._storage(storage)
            if name is not None:
                return new_study(metric, seed, backend, name)
            name = f"{self.path.resolve().name}-{metric.value}-{uuid.uuid4().hex[:8]}"
            study = new_study(metric, seed, backend, name)
        except StudyError:
            raise
        except Exception as err:  # a bad URL, an unreachable database, a driver missing
            raise StudyError(f"cannot open the study in {storage}: {err}") from None
        for key, value in attrs.items():
            study.set_user_attr(key, value)
        previous = studies.get(str(info.get("current")))
        if previous is not None:
            _copy_trials(new_study(Metric(info["current"]), seed, backend, previous), study, metric)
        studies[metric.value] = name
        atomic_write_json(
            self.path / STUDY_INFO_NAME,
            {"storage": storage, "studies": studies, "current": metric.value},
        )
        return study

    @staticmethod
    def _repair_journal(path: Path) -> None:
        """Make a journal a killed run left readable and appendable again: cut a last line
        the kill tore (Optuna would append after it, and then no longer read the file), and
        remove the lock it may have held. The caller holds the directory's lock."""
        with contextlib.suppress(FileNotFoundError):
            os.unlink(str(path) + _JOURNAL_LOCK_SUFFIX)
        if not path.exists():
            return
        with path.open("r+b") as handle:
            data = handle.read()
            if data and not data.endswith(b"\n"):
                handle.truncate(data.rfind(b"\n") + 1)
                handle.flush()
                os.fsync(handle.fileno())

    # --- reading -------------------------------------------------------------------------------

    def load(self) -> optuna.Study | None:
        """The study last ranked into, for reading (None: no study here)."""
        info = self.info()
        name = (info.get("studies") or {}).get(str(info.get("current")))
        if name is None:
            return None
        import optuna

        optuna.logging.set_verbosity(optuna.logging.WARNING)
        try:
            return optuna.load_study(study_name=name, storage=self._storage(info.get("storage")))
        except Exception as err:
            where = self.storage_description()
            raise StudyError(f"cannot read the study {name} in {where}: {err}") from None

    def records(self) -> list[dict[str, Any]]:
        """Every finished experiment's record (:func:`autotune.tuner.trials.record_of`), in
        the order they finished."""
        study = self.load()
        if study is None:
            return []
        attrs = study.user_attrs
        trials = study.get_trials(deepcopy=False)
        # A killed run's experiment that a later trial ran again is that trial's record.
        superseded = {t.user_attrs.get(SUPERSEDES_ATTR) for t in trials}
        finished = [
            t
            for t in trials
            if t.state.is_finished() and "status" in t.user_attrs and t.number not in superseded
        ]
        finished.sort(key=lambda t: (t.datetime_complete is None, t.datetime_complete, t.number))
        return [record_of(t, attrs) for t in finished]

    def delete(self) -> None:
        """Delete the studies and the files that say where they are."""
        info = self.info()
        storage = info.get("storage")
        if storage is not None:
            import optuna

            for name in (info.get("studies") or {}).values():
                with contextlib.suppress(Exception):  # already gone
                    optuna.delete_study(study_name=name, storage=self._storage(storage))
        for name in (JOURNAL_NAME, JOURNAL_NAME + _JOURNAL_LOCK_SUFFIX, STUDY_INFO_NAME):
            (self.path / name).unlink(missing_ok=True)


def _copy_trials(source: optuna.Study, target: optuna.Study, metric: Metric) -> None:
    """``source``'s experiments as trials of ``target``, valued by ``metric``."""
    import optuna
    from optuna.trial import TrialState

    for trial in source.get_trials(deepcopy=False):
        if "name" not in trial.user_attrs:
            continue
        measured = trial.user_attrs.get("metrics")
        value = metric.of(measured) if measured else None
        state = trial.state
        if state is TrialState.RUNNING:  # left by a killed run: its experiment runs again
            source.tell(trial.number, state=TrialState.FAIL)
        if state is TrialState.WAITING:
            continue
        steps = {step: value for step in trial.intermediate_values} if value is not None else {}
        target.add_trial(
            optuna.trial.create_trial(
                state=state,
                value=value if state is TrialState.COMPLETE else None,
                params=trial.params,
                distributions=trial.distributions,
                user_attrs=trial.user_attrs,
                intermediate_values=steps,
            )
        )
