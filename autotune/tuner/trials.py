"""Every experiment as a trial of an Optuna study: the run's record.

A trial's parameters are its configuration (:data:`STAGE_PARAM`, :data:`MICRO_BATCH_PARAM`,
:data:`OFFLOAD_PARAM` where the optimizer is offloaded, :data:`CHECKPOINTING_PARAM` where
activations are checkpointed, and each tuned knob under its dotted config key), its value the
run's metric, its state how the experiment ended (:func:`state_of`), and its user attributes
everything the experiment recorded (:func:`result_attrs`; :func:`record_of` reads them back).
A trial is asked when its experiment starts (``RUNNING``: an interrupted run's are run again
on resume) and told when it finishes: the tell is the commit point.

The study's own user attributes say what was tuned (``target``, ``engine``), written once by
the results directory.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from autotune.experiment import ExperimentResult
from autotune.metric import Metric

if TYPE_CHECKING:
    import optuna
    from optuna.distributions import BaseDistribution
    from optuna.trial import FrozenTrial

STAGE_PARAM = "zero_stage"
MICRO_BATCH_PARAM = "micro_batch_size"
OFFLOAD_PARAM = "offload_optimizer"
CHECKPOINTING_PARAM = "activation_checkpointing"

# What a trial records beside its result: how it was proposed.
PHASE_ATTR = "phase"
# A suggestion (of a sampler the user passed) that was no configuration to run, and why.
NOT_RUN_ATTR = "not_run"
REPEAT_OF_ATTR = "repeat_of"
DS_CONFIG_ATTR = "ds_config"
# The result's own fields, each a user attribute (ExperimentResult.to_dict's keys).
RESULT_ATTRS = (
    "name",
    "status",
    "metrics",
    "error",
    "error_detail",
    "failed_rank",
    "started_at",
    "timings",
    "node_ids",
    "ended_after_steps",
    "stopped_after_steps",
    "infrastructure_retries",
)


def state_of(result: ExperimentResult) -> optuna.trial.TrialState:
    """COMPLETE for a measurement, PRUNED for a loser stopped after its first timed steps,
    FAIL for everything that did not run ok (oom, error, timeout, a crash)."""
    from optuna.trial import TrialState

    if not result.ok or result.metrics is None:
        return TrialState.FAIL
    return TrialState.PRUNED if result.stopped_after_steps is not None else TrialState.COMPLETE


def result_attrs(result: ExperimentResult) -> dict[str, Any]:
    """The user attributes a finished experiment's trial carries (JSON values)."""
    return result.to_dict()


def record_of(trial: FrozenTrial, study_attrs: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """A finished or running trial as a record: the experiment's result fields, how it was
    proposed (``proposed``: the trial's number, ``phase``, ``repeat_of``), its
    ``ds_config``, and the study's ``target`` and ``engine``."""
    attrs = trial.user_attrs
    record: dict[str, Any] = {key: attrs.get(key) for key in RESULT_ATTRS}
    record.update(
        proposed=trial.number,
        phase=attrs.get(PHASE_ATTR),
        repeat_of=attrs.get(REPEAT_OF_ATTR),
        ds_config=attrs.get(DS_CONFIG_ATTR) or {},
        target=(study_attrs or {}).get("target"),
        engine=(study_attrs or {}).get("engine"),
    )
    record["infrastructure_retries"] = record["infrastructure_retries"] or 0
    record["node_ids"] = record["node_ids"] or []
    record["timings"] = record["timings"] or {}
    return record


def new_study(
    metric: Metric,
    seed: int = 0,
    storage: str | optuna.storages.BaseStorage | None = None,
    name: str | None = None,
) -> optuna.Study:
    """A study whose direction is ``metric``'s, in ``storage`` (None: in memory). Its sampler
    is never consulted for the trials the tuner asks: their parameters are fixed."""
    import optuna
    from optuna.study import StudyDirection

    optuna.logging.set_verbosity(optuna.logging.WARNING)  # else a line per trial
    direction = StudyDirection.MINIMIZE if metric.lower_is_better else StudyDirection.MAXIMIZE
    return optuna.create_study(
        storage=storage,
        study_name=name,
        direction=direction,
        sampler=optuna.samplers.RandomSampler(seed),
        load_if_exists=True,
    )


@dataclass(frozen=True)
class PastExperiment:
    """An experiment of an earlier run, as its trial recorded it.

    Attributes:
        number: the number it was proposed as (its trial's).
        name: its name.
        repeat_of: the configuration it measured again (None: its own).
        result: how it ended (None: it was still running when the run stopped).
        params: its configuration as the trial's parameters.
        dists: their distributions.
    """

    number: int
    name: str
    repeat_of: str | None
    result: ExperimentResult | None
    params: dict[str, Any]
    dists: dict[str, BaseDistribution]


def past_experiments(trials: Iterable[FrozenTrial]) -> list[PastExperiment]:
    """The experiments ``trials`` record, in the order they were proposed: finished ones
    with their result, those left running without."""
    past = []
    for trial in sorted(trials, key=lambda t: t.number):
        attrs = trial.user_attrs
        if "name" not in attrs or trial.state.name == "WAITING":
            continue  # not an experiment (a trial someone added by hand)
        finished = trial.state.is_finished() and attrs.get("status") is not None
        if trial.state.is_finished() and not finished:
            continue  # failed without a result: an experiment that never ran
        result = ExperimentResult.from_dict(record_of(trial)) if finished else None
        past.append(
            PastExperiment(
                trial.number,
                attrs["name"],
                attrs.get(REPEAT_OF_ATTR),
                result,
                dict(trial.params),
                dict(trial.distributions),
            )
        )
    return past


# Set on a trial a killed run left before it was named (see :func:`fail_unnamed`).
ABANDONED_ATTR = "abandoned"


def fail_unnamed(study: optuna.Study) -> int:
    """Fail the trials a killed run left between creating a trial and naming it (a trial
    is created, then named, in separate writes): running or waiting, no experiment's name.
    Nothing ran for them; left waiting, the next trial asked would take one's parameters.
    Returns how many there were."""
    from optuna.trial import TrialState

    storage = study._storage
    left = study.get_trials(deepcopy=False, states=(TrialState.RUNNING, TrialState.WAITING))
    unnamed = [t for t in left if "name" not in t.user_attrs]
    for trial in unnamed:
        storage.set_trial_user_attr(trial._trial_id, ABANDONED_ATTR, "the run was killed first")
        storage.set_trial_state_values(trial._trial_id, TrialState.FAIL)
    return len(unnamed)


class TrialLog:
    """Writes a tuner's experiments into ``study`` (see the module docstring).

    Args:
        study: the study; its direction is ``metric``'s.
        metric: the value every trial reports.
    """

    def __init__(self, study: optuna.Study, metric: Metric) -> None:
        self.study = study
        self._metric = metric
        self._open: dict[str, Any] = {}  # experiment name → its running optuna.Trial

    def start(
        self,
        name: str,
        params: Mapping[str, Any],
        distributions: Mapping[str, BaseDistribution],
        attrs: Mapping[str, Any],
        *,
        number: int | None = None,
        trial: optuna.Trial | None = None,
        sampled: bool = False,
    ) -> int:
        """The trial of experiment ``name``; its number. It is the running trial an
        interrupted run left (``number``), or one a sampler was already asked (``trial``), or
        asked now: of the study's sampler (``sampled``: the search, which hands Optuna
        ``params``), else with ``params`` fixed (a re-measurement)."""
        import optuna

        if trial is None and number is not None:
            trial = optuna.trial.Trial(self.study, self._trial_id(number))
        elif trial is None:
            if not sampled:
                self.study.enqueue_trial(dict(params), skip_if_exists=False)
            trial = self.study.ask(dict(distributions))
            if sampled and trial.params != dict(params):  # the study's sampler is not the search
                raise RuntimeError(f"the study sampled {trial.params} for {name}, not {params}")
        for key, value in {"name": name, **attrs}.items():
            trial.set_user_attr(key, value)
        self._open[name] = trial
        return int(trial.number)

    def finish(self, result: ExperimentResult, ds_config: Mapping[str, Any] | None) -> None:
        """Commit ``result`` to its trial: attributes first, then the state and value."""
        trial = self._open.pop(result.name)
        for key, value in result_attrs(result).items():
            trial.set_user_attr(key, value)
        if ds_config is not None:
            trial.set_user_attr(DS_CONFIG_ATTR, dict(ds_config))
        state = state_of(result)
        value = self._metric.of(result.metrics) if result.metrics is not None else None
        if state.name == "PRUNED" and value is not None:
            trial.report(value, step=result.stopped_after_steps or 0)
        self.study.tell(trial, value if state.name == "COMPLETE" else None, state=state)

    def add(
        self,
        result: ExperimentResult,
        params: Mapping[str, Any],
        distributions: Mapping[str, BaseDistribution],
        attrs: Mapping[str, Any],
    ) -> int:
        """A finished experiment the tuner did not ask for, as a finished trial; its number."""
        number = self.start(result.name, params, distributions, attrs)
        self.finish(result, None)
        return number

    def _trial_id(self, number: int) -> int:
        for trial in self.study.get_trials(deepcopy=False):
            if trial.number == number:
                return int(trial._trial_id)
        raise KeyError(f"the study has no trial {number}")
