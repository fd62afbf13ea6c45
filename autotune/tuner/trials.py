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

import functools
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from autotune.config import ConfigError
from autotune.experiment import ExperimentResult
from autotune.metric import Metric
from autotune.tuner.naming import repeat_name

if TYPE_CHECKING:
    import optuna
    from optuna.trial import FrozenTrial

    from autotune.tuner.history import Entry, Experiment
    from autotune.tuner.search_space import SearchSpace

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
# A trial that runs again what a killed run left running takes that trial's place in the
# order experiments were proposed (its experiment's number), and names the trial it
# supersedes (that trial's number; the old trial is then left out).
PROPOSED_AS_ATTR = "proposed_as"
SUPERSEDES_ATTR = "supersedes"
# Set on a trial a killed run left queued, which nothing will run.
ABANDONED_ATTR = "abandoned"
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
    "samples_per_rank",
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
    """A study whose direction is ``metric``'s, in ``storage`` (None: in memory); the tuner
    sets its sampler and pruner."""
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


def experiments_of(
    trials: Iterable[FrozenTrial], space: SearchSpace
) -> tuple[list[Experiment], list[str]]:
    """The experiments ``trials`` record (see :mod:`autotune.tuner.history`), and the names of
    the finished ones in the order they were told.

    A trial is an experiment once it has a configuration: autotune's name it (user attribute
    ``name``), a trial of a plain Optuna study is named by its parameters (one with the same
    parameters as an earlier one measures it again). Left out: trials still waiting, a
    suggestion that was no configuration (:data:`NOT_RUN_ATTR`), one a killed run left that a
    later trial runs again (:data:`SUPERSEDES_ATTR`) or that nothing will
    (:data:`ABANDONED_ATTR`).
    """
    from optuna.trial import TrialState

    from autotune.tuner.history import Experiment

    trials = sorted(trials, key=lambda t: t.number)
    superseded = {t.user_attrs.get(SUPERSEDES_ATTR) for t in trials}
    experiments: list[Experiment] = []
    metric = space.config.autotuning.metric
    steps: dict[str, tuple[int, float]] = {}  # configuration → its global batch, FLOPs a rank
    runs: dict[str, int] = {}  # configuration → its experiments so far
    finished: list[tuple[Any, int, str]] = []
    for trial in trials:
        attrs = trial.user_attrs
        skip = trial.state is TrialState.WAITING or trial.number in superseded
        if skip or NOT_RUN_ATTR in attrs or ABANDONED_ATTR in attrs or not trial.params:
            continue
        entry = space.entry_of_trial(trial)
        if entry is None:
            continue  # not a configuration (yet: its parameters are still being suggested)
        config = space.name_of(entry)
        repeat_of = attrs.get(REPEAT_OF_ATTR)
        name = attrs.get("name")
        if name is None:  # a plain study's: its parameters name it
            repeat_of = config if config in runs else None
            name = repeat_name(config, runs[config]) if repeat_of else config
        runs[repeat_of or name] = runs.get(repeat_of or name, 0) + 1
        result = None
        if trial.state.is_finished():
            read = functools.partial(_read_result, trial, name, metric, space, entry, steps)
            result = space.remembered(trial, read)
        if result is not None:
            finished.append((trial.datetime_complete, trial.number, name))
        experiments.append(
            Experiment(
                name,
                attrs.get(PROPOSED_AS_ATTR, trial.number),
                entry,
                repeat_of,
                result,
                attrs.get(PHASE_ATTR),
                trial.number,
            )
        )
    told = [name for *_, name in sorted(finished, key=lambda f: (f[0] is None, f[0], f[1]))]
    return experiments, told


def _read_result(
    trial: FrozenTrial,
    name: str,
    metric: Metric,
    space: SearchSpace,
    entry: Entry,
    steps: dict[str, tuple[int, float]],
) -> ExperimentResult:
    return result_of(trial, name, metric, *_step_of(space, entry, steps))


def _recorded(trial: FrozenTrial) -> bool:
    """Whether autotune recorded the trial's experiment whole (its result's fields)."""
    return trial.user_attrs.get("name") is not None and "metrics" in trial.user_attrs


def _step_of(
    space: SearchSpace, entry: Entry, known: dict[str, tuple[int, float]]
) -> tuple[int, float]:
    """The global batch of ``entry``'s step and the FLOPs a rank computes in it (0: the
    model is not known), kept in ``known``."""
    name = space.name_of(entry)
    if name not in known:
        try:
            ds_config = space.config_of(entry)
        except ConfigError:
            ds_config = {}
        batch = int(ds_config.get("train_batch_size") or 1)
        micro = int(ds_config.get("train_micro_batch_size_per_gpu") or 1)
        steps = int(ds_config.get("gradient_accumulation_steps") or 1)
        info = space.model_info
        known[name] = (batch, info.flops_per_sample * micro * steps if info else 0.0)
    return known[name]


# What a plain trial that failed without a status is taken for.
UNEXPLAINED = "oom: the trial failed and gave no status (taken as out of memory)"


def result_of(
    trial: FrozenTrial, name: str, metric: Metric, batch: int, flops_per_step: float
) -> ExperimentResult:
    """How a finished trial's experiment ended: the result autotune recorded in its user
    attributes, else (a plain Optuna objective's) from its state and value: ``COMPLETE`` ran
    ok at that value of ``metric``; ``PRUNED`` after reporting stopped early at its last
    report; with user attribute ``status`` (``"oom"``, ``"error"``, ``"timeout"``) failed so.
    A ``FAIL`` that gives no status is taken for out of memory (:data:`UNEXPLAINED`: what a
    failure at the sizes this search tries mostly is, and how Ray Tune reports one), a
    ``PRUNED`` without a report for an error. An objective may set ``peak_memory_bytes``;
    ``batch`` and ``flops_per_step`` are the experiment's (a global batch, a rank's FLOPs)."""
    from optuna.trial import TrialState

    from autotune.experiment import Metrics, Status

    attrs = trial.user_attrs
    if _recorded(trial):
        return ExperimentResult.from_dict(record_of(trial))
    status = attrs.get("status")
    if status is not None and status not in {s.value for s in Status}:
        status = Status.error.value
    steps = trial.intermediate_values
    value = trial.value if trial.state is TrialState.COMPLETE else None
    if value is None and trial.state is TrialState.PRUNED and steps and status is None:
        value = steps[max(steps)]
    if status is None and trial.state is TrialState.FAIL:
        return ExperimentResult(name, Status.oom, error=attrs.get("error") or UNEXPLAINED)
    if value is None or status not in (None, Status.ok.value):
        error = attrs.get("error") or (status or "the trial was pruned before it reported")
        return ExperimentResult(name, Status(status or Status.error.value), error=str(error))
    metrics = Metrics.from_window(
        [metric.step_time_s(value, batch, flops_per_step)],
        batch,
        flops_per_step,
        int(attrs.get("peak_memory_bytes") or 0),
    )
    stopped = max(steps) if trial.state is TrialState.PRUNED else None
    return ExperimentResult(name, Status.ok, metrics, stopped_after_steps=stopped)
