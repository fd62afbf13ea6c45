"""What the driver writes into the run's study, and reads back beside the trials.

The trials (:mod:`autotune.tuner.trials`): each experiment's trial asked (sampled, or queued
with fixed parameters), named, and told with its result; a suggestion that is no
configuration told ``FAIL`` unrun; what a killed run left failed or superseded. The study's
own user attributes (:class:`RunRecord`): why the search ended, why the run ended, and each
wait for a quiet machine, so that a resumed run decides as the interrupted one would have.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from autotune.experiment import ExperimentResult
from autotune.metric import Metric
from autotune.tuner.reasons import StopReason
from autotune.tuner.trials import (
    ABANDONED_ATTR,
    DS_CONFIG_ATTR,
    NOT_RUN_ATTR,
    PHASE_ATTR,
    PROPOSED_AS_ATTR,
    REPEAT_OF_ATTR,
    SUPERSEDES_ATTR,
    experiments_of,
    record_of,
    result_attrs,
    state_of,
)

if TYPE_CHECKING:
    import optuna

    from autotune.tuner.candidate import Step
    from autotune.tuner.history import Experiment, History
    from autotune.tuner.search_space import SearchSpace

# What a run records in its study beside the trials (the study's user attributes): why the
# search ended (the samplers write it too, as they stop a study's optimize), why the run
# ended, and each wait for a busy machine to quiet down.
SEARCH_END_ATTR = "search_end"
RUN_END_ATTR = "run_end"
QUIET_WAITS_ATTR = "quiet_waits"


@dataclass(frozen=True)
class QuietWait:
    """A wait for a busy machine to quiet down: after how many results, whether the machine
    was then seen quiet, and for how long it was waited for."""

    after: int
    quiet: bool
    waited_s: float


@dataclass(frozen=True)
class RunRecord:
    """What a run recorded in its study beside the trials (see :data:`SEARCH_END_ATTR`).

    Attributes:
        search_ended: the search is over; re-measurement follows.
        search_stop: why (None: it ran all it had).
        left: the experiment the time budget left out when it ended the search.
        run_ended: the run is over.
        run_stop: why, where not the search's reason.
        waits: the waits for a quiet machine, in order.
    """

    search_ended: bool = False
    search_stop: StopReason | None = None
    left: str | None = None
    run_ended: bool = False
    run_stop: StopReason | None = None
    waits: tuple[QuietWait, ...] = ()

    @classmethod
    def of(cls, study: optuna.Study) -> RunRecord:
        attrs = study.user_attrs
        search, run = attrs.get(SEARCH_END_ATTR), attrs.get(RUN_END_ATTR)
        return cls(
            search_ended=search is not None,
            search_stop=_stop(search),
            left=(search or {}).get("left"),
            run_ended=run is not None,
            run_stop=_stop(run),
            waits=tuple(QuietWait(**wait) for wait in attrs.get(QUIET_WAITS_ATTR, ())),
        )

    @property
    def stop(self) -> StopReason | None:
        """Why the run, else the search, ended (None: it has not, or it ran all it had)."""
        return self.run_stop or self.search_stop


def _stop(record: Mapping[str, Any] | None) -> StopReason | None:
    stop = (record or {}).get("stop")
    return StopReason.from_dict(stop) if stop else None


def record_end(
    study: optuna.Study, attr: str, stop: StopReason | None, left: str | None = None
) -> None:
    """Record in ``study`` that the search (:data:`SEARCH_END_ATTR`) or the run
    (:data:`RUN_END_ATTR`) ended, why, and what the time budget left out."""
    record: dict[str, Any] = {"stop": stop.to_dict() if stop is not None else None}
    if left is not None:
        record["left"] = left
    study.set_user_attr(attr, record)


def record_wait(study: optuna.Study, wait: QuietWait) -> None:
    waits = list(study.user_attrs.get(QUIET_WAITS_ATTR, ()))
    study.set_user_attr(QUIET_WAITS_ATTR, [*waits, dataclasses.asdict(wait)])


def ask(
    study: optuna.Study,
    params: tuple[dict[str, Any], dict[str, Any]],
    attrs: Mapping[str, Any],
    queued: bool,
) -> optuna.Trial:
    """The trial of an experiment with ``params`` (and their distributions), named by
    ``attrs``: queued with those parameters fixed (a re-measurement, or one a killed run
    left), else sampled, the study's sampler handing them."""
    values, distributions = params
    if queued:
        study.enqueue_trial(values, user_attrs=dict(attrs))
    trial = study.ask(distributions)
    if not queued:
        if trial.params != values:
            raise RuntimeError(f"the study's sampler sampled {trial.params}, not {values}")
        name_trial(trial, attrs)
    return trial


def name_trial(trial: optuna.Trial, attrs: Mapping[str, Any]) -> None:
    for key, value in attrs.items():
        trial.set_user_attr(key, value)


def finish(
    study: optuna.Study,
    trial: optuna.Trial,
    result: ExperimentResult,
    ds_config: Mapping[str, Any],
    metric: Metric,
) -> None:
    """Commit ``result`` to its trial: attributes first, then the state and its value of
    ``metric`` (a loser stopped early reports its value at the step it stopped after)."""
    for key, value in result_attrs(result).items():
        trial.set_user_attr(key, value)
    # Written last: a trial that has it holds its whole result (see settle_stale).
    trial.set_user_attr(DS_CONFIG_ATTR, dict(ds_config))
    _tell(study, trial, result, metric)


def _tell(
    study: optuna.Study, trial: optuna.Trial | int, result: ExperimentResult, metric: Metric
) -> None:
    """Tell ``result``'s state and its value of ``metric``: a loser stopped early reports
    its value at the step it stopped after (where the trial is at hand to report it)."""
    state = state_of(result)
    value = metric.of(result.metrics) if result.metrics is not None else None
    if state.name == "PRUNED" and value is not None and not isinstance(trial, int):
        trial.report(value, step=result.stopped_after_steps or 0)
    study.tell(trial, value if state.name == "COMPLETE" else None, state=state)


def refuse(study: optuna.Study, trial: optuna.Trial, why: str) -> None:
    """A suggestion that is no configuration to run: told ``FAIL``, unrun, with why."""
    from optuna.trial import TrialState

    trial.set_user_attr(NOT_RUN_ATTR, why)
    study.tell(trial, state=TrialState.FAIL)


def supersede(study: optuna.Study, number: int) -> None:
    """The trial a killed run left running, now run again by a later one: failed, so that
    nothing waits for it."""
    from optuna.trial import TrialState

    study.tell(number, state=TrialState.FAIL)


def settle_stale(study: optuna.Study, space: SearchSpace) -> int:
    """Settle what a killed run left unfinished. A running trial whose result was recorded
    whole (the kill came between :func:`finish`'s attributes and its tell) is told it: that
    experiment ran. Failed: trials queued (a re-measurement's parameters, its trial not yet
    asked: left waiting, the next trial asked would take them) and running trials with no
    configuration yet (killed while it was suggested). Running trials with one are run
    again (they are owed). Returns how many were failed."""
    from optuna.trial import TrialState

    metric = space.config.autotuning.metric
    for trial in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        if DS_CONFIG_ATTR in trial.user_attrs:
            _tell(study, trial.number, ExperimentResult.from_dict(record_of(trial)), metric)
    count = 0
    while study.get_trials(deepcopy=False, states=(TrialState.WAITING,)):
        queued = study.ask()
        queued.set_user_attr(ABANDONED_ATTR, "the run was killed first")
        study.tell(queued, state=TrialState.FAIL)
        count += 1
    running = study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
    experiments = {e.trial_number for e in experiments_of(running, space)[0]}
    for trial in running:
        if trial.number not in experiments:
            study.tell(trial.number, state=TrialState.FAIL)
            count += 1
    return count


def add_result(study: optuna.Study, space: SearchSpace, result: ExperimentResult) -> None:
    """A finished experiment no trial was asked for (history), as a finished trial.

    Raises:
        KeyError: ``result`` names no configuration of the space.
    """
    from optuna.trial import create_trial

    entry = space.entry_named(result.name)
    values, distributions = space.params(entry)
    state = state_of(result)
    metric = space.config.autotuning.metric
    value = metric.of(result.metrics) if result.metrics is not None else None
    trial = create_trial(
        params=values,
        distributions=distributions,
        value=value if state.name == "COMPLETE" else None,
        state=state,
        user_attrs={**result_attrs(result), PHASE_ATTR: None, REPEAT_OF_ATTR: None},
        intermediate_values=(
            {result.stopped_after_steps or 0: value}
            if state.name == "PRUNED" and value is not None
            else None
        ),
    )
    study.add_trial(trial)


def start(
    study: optuna.Study,
    space: SearchSpace,
    history: History,
    step: Step,
    owed: Experiment | None = None,
    trial: optuna.Trial | None = None,
) -> optuna.Trial:
    """The trial of the experiment ``step`` runs, named (its phase, what it measures again):
    asked of the sampler (a search's proposal; ``trial``: one already asked), or queued with
    its configuration's parameters (a re-measurement, or one a killed run left, ``owed``,
    whose trial the new one replaces in its place)."""
    assert step.name is not None and step.entry is not None
    attrs: dict[str, Any] = {
        "name": step.name,
        PHASE_ATTR: step.phase.value,
        REPEAT_OF_ATTR: step.repeat_of,
    }
    if owed is not None:
        attrs[PROPOSED_AS_ATTR] = owed.number
        attrs[SUPERSEDES_ATTR] = owed.trial_number
    if trial is None:
        queued = step.repeat_of is not None or owed is not None
        trial = ask(study, space.params(step.entry, history), attrs, queued)
    else:
        name_trial(trial, attrs)
    if owed is not None:
        supersede(study, owed.trial_number)
    return trial
