"""What autotune searches, as an Optuna objective sees it: :class:`SearchSpace`.

A configuration is a trial's parameters (:data:`~autotune.tuner.trials.STAGE_PARAM`,
:data:`~autotune.tuner.trials.MICRO_BATCH_PARAM`, the optimizer's offload and activation
checkpointing where the stage may switch them, and each knob tuned at the stage under its
dotted config key), suggested define-by-run (:meth:`SearchSpace.suggest`), so that any Optuna
sampler can search it and autotune's samplers (:mod:`autotune.samplers`) hand it theirs. The
same parameters name the experiment and make its whole DeepSpeed config.

The space follows the model: a workload's is known up front (``model_info``, or profiled from
``workload``); a script's is measured by its first experiment, so :meth:`SearchSpace.plan`
takes it from the study's results, and a trial's suggestions follow what its study measured.
"""

from __future__ import annotations

import copy
import itertools
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import optuna
from optuna.distributions import BaseDistribution, CategoricalDistribution, IntDistribution

from autotune.config import Config, ConfigError, load_config, parse_size
from autotune.config.knobs import KNOB_BY_KEY, name_position
from autotune.tuner.history import Entry, History, Knobs
from autotune.tuner.space import TuningSpace, Variant, build_space
from autotune.tuner.trials import (
    CHECKPOINTING_PARAM,
    MICRO_BATCH_PARAM,
    OFFLOAD_PARAM,
    STAGE_PARAM,
)

if TYPE_CHECKING:
    from autotune.experiment import ExperimentResult
    from autotune.profiling.model_info import ModelInfo


class NotRunnable(optuna.TrialPruned):
    """A suggestion that is no configuration of the space (a pruned stage, a micro-batch the
    batch limits rule out, a knob value not searched): pruned unrun."""


class SearchSpace:
    """Every configuration autotune may try for one config, world size and model.

    Args:
        config: a DeepSpeed-style config with search lists (a dict, a JSON file's path, or a
            loaded :class:`~autotune.config.Config`), as ``autotune run`` reads it.
        world_size: data-parallel ranks (default: the loaded config's, else 2).
        device_memory: the per-rank budget: bytes, or a size such as ``"16GiB"`` (default:
            the config's ``autotuning.device_memory_bytes``); without it and a model, stages
            are pruned only by running out of memory.
        model_info: the model's sizes (a :class:`~autotune.profiling.model_info.ModelInfo` or
            a dict of its fields: ``num_params``, ``param_bytes``,
            ``activation_bytes_per_sample``, ``flops_per_sample``, ...).
        workload: instead of ``model_info``: a workload to profile, as ``run`` does
            (``gpt``, ``mlp``, ``hf:llama``, ``package.module:function``).
        workload_args: the workload's keyword arguments.

    Raises:
        ConfigError: the config, or a size, breaks a rule.

    Example:
        >>> space = SearchSpace({"zero_optimization": {"stage": [1, 2]}}, world_size=2)
        >>> space.direction, [p.variant.label for p in space.plan().plans]
        ('maximize', ['z1', 'z2'])
        >>> params = {"zero_stage": 2, "micro_batch_size": 8}
        >>> space.name(params), space.ds_config(params)["train_batch_size"]
        ('z2_mbs8', 16)
    """

    def __init__(
        self,
        config: Config | Mapping[str, Any] | str | Path,
        *,
        world_size: int | None = None,
        device_memory: int | str | None = None,
        model_info: ModelInfo | Mapping[str, Any] | None = None,
        workload: str | None = None,
        workload_args: Mapping[str, Any] | None = None,
    ) -> None:
        if isinstance(config, Config) and world_size in (None, config.world_size):
            self.config = config
        else:
            spec = config.spec if isinstance(config, Config) else config
            self.config = load_config(spec, world_size=world_size or 2)
        if device_memory is None:
            self.device_memory_bytes = self.config.device_memory_bytes
        else:
            try:
                self.device_memory_bytes = parse_size(device_memory)
            except ValueError as err:
                raise ConfigError("", str(err), "device_memory") from None
        if workload is not None and model_info is None:
            model_info = _profiled(self.config, workload, workload_args or {})
        self.model_info = _as_model_info(model_info)
        # Before the model is known (a script's first experiments); also what names use.
        self.blind = build_space(self.config, None, self.device_memory_bytes)
        self._plans: dict[ModelInfo | None, TuningSpace] = {None: self.blind}
        self._named: tuple[tuple[Any, ...], dict[str, Entry]] = ((), {})
        self._configs: dict[str, dict[str, Any] | ConfigError] = {}
        self._names: dict[tuple[Any, ...], str] = {}
        # A finished trial's configuration and result, by the trial (see _trial_key).
        self._trial_entries: dict[tuple[Any, ...], Entry | None] = {}
        self._trial_results: dict[tuple[Any, ...], ExperimentResult] = {}

    # --- the space ----------------------------------------------------------------------------

    @property
    def direction(self) -> str:
        """The study's direction for the config's metric: ``"maximize"``, or ``"minimize"``
        for latency."""
        return "minimize" if self.config.autotuning.metric.lower_is_better else "maximize"

    def plan(self, history: History | None = None) -> TuningSpace:
        """The variants searched, with the model's sizes: this space's, else the first a
        result in ``history`` measured (a script's), else none (no memory estimate)."""
        info = self.model(history)
        if info not in self._plans:
            self._plans[info] = build_space(self.config, info, self.device_memory_bytes)
        return self._plans[info]

    def model(self, history: History | None = None) -> ModelInfo | None:
        """The model's sizes: this space's, else the first a result in ``history``
        measured (a script's experiments measure it), else None."""
        return self.model_info if self.model_info is not None else _measured(history, self)

    def history(self, trials: list[optuna.trial.FrozenTrial]) -> History:
        """What ``trials`` (a study's) say of the run (:mod:`autotune.tuner.history`)."""
        from autotune.tuner.trials import experiments_of

        experiments, told = experiments_of(trials, self)
        return History(experiments, told)

    # --- a trial's configuration --------------------------------------------------------------

    def suggest(self, trial: optuna.Trial) -> dict[str, Any]:
        """Suggest a configuration in ``trial``, define-by-run: the stage, the micro-batch,
        the offload and checkpointing switches where the stage has both, each knob tuned at
        the stage; its parameters.

        Raises:
            NotRunnable: the suggestion is no configuration of the space (a sampler that
                does not know it: Optuna's own); an ``optuna.TrialPruned``.
        """
        space = self.plan(self.history(trial.study.get_trials(deepcopy=False)))
        stage = trial.suggest_categorical(STAGE_PARAM, space.stages)
        size = trial.suggest_int(MICRO_BATCH_PARAM, 1, max(space.sizes), log=True)
        plans = [p for p in space.plans if p.variant.stage == stage]
        if not plans:
            raise NotRunnable(f"stage {stage} is pruned: {space.pruned.get(f'z{stage}', '')}")
        offload = _switch(trial, OFFLOAD_PARAM, {p.variant.offload_optimizer for p in plans})
        plans = [p for p in plans if p.variant.offload_optimizer == offload]
        checkpointed = _switch(
            trial, CHECKPOINTING_PARAM, {p.variant.activation_checkpointing for p in plans}
        )
        plan = next(p for p in plans if p.variant.activation_checkpointing == checkpointed)
        if size not in plan.ladder:
            raise NotRunnable(f"micro-batch {size} is not one {plan.variant.label} may run")
        for key, values in plan.knobs:
            trial.suggest_categorical(key, knob_choices(values, space.base.get(key)))
        return dict(trial.params)

    def entry(self, params: Mapping[str, Any]) -> Entry:
        """The configuration ``params`` make (knobs ``()`` where each is the config's own).

        Raises:
            KeyError: ``params`` have no stage or micro-batch.
        """
        variant = Variant(
            int(params[STAGE_PARAM]),
            bool(params.get(OFFLOAD_PARAM, False)),
            bool(params.get(CHECKPOINTING_PARAM, False)),
        )
        size = int(params[MICRO_BATCH_PARAM])
        keys = sorted((k for k in params if k in KNOB_BY_KEY), key=name_position)
        knobs: Knobs = tuple((k, params[k]) for k in keys)
        return self.entry_at(variant, size, knobs)

    def entry_at(self, variant: Variant, size: int, knobs: Knobs = ()) -> Entry:
        """``variant`` at micro-batch ``size`` with ``knobs``: a value for every knob tuned at
        its stage, the config's own where ``knobs`` has none."""
        base = self.blind.base
        values = {key: base.get(key) for key in self.blind.knob_keys(variant.stage)}
        values.update(knobs)
        full = tuple(sorted(values.items(), key=lambda item: name_position(item[0])))
        differing = {key: value for key, value in full if value != base.get(key)}
        return Entry(
            variant,
            size,
            full,
            self.blind.overrides(variant, size, differing),
            own_knobs=not differing,
        )

    def entry_named(self, name: str) -> Entry:
        """The configuration named ``name``, among every variant's sizes and knob points of
        the spaces searched so far.

        Raises:
            KeyError: no configuration of the space has that name.
        """
        if len(self._named[0]) != len(self._plans):
            entries: dict[str, Entry] = {}
            for space in self._plans.values():
                for plan in space.plans:
                    keys = [key for key, _ in plan.knobs]
                    points = [(), *itertools.product(*(values for _, values in plan.knobs))]
                    for point in points:
                        knobs = tuple(zip(keys, point, strict=False))
                        for size in plan.ladder:
                            entry = self.entry_at(plan.variant, size, knobs)
                            entries.setdefault(self.name_of(entry), entry)
            self._named = (tuple(self._plans), entries)
        return self._named[1][name]

    def name_of(self, entry: Entry) -> str:
        """The name of ``entry``: the stage, the micro-batch, and each value that differs
        from the config's."""
        key = (entry.variant, entry.micro_batch_size, entry.knobs)
        if key not in self._names:
            self._names[key] = self.blind.name(entry.overrides)
        return self._names[key]

    def entry_of_trial(self, trial: optuna.trial.FrozenTrial) -> Entry | None:
        """The configuration ``trial``'s parameters make (None: they make none yet); a
        finished trial's is kept."""
        key = _trial_key(trial)
        if key is not None and key in self._trial_entries:
            return self._trial_entries[key]
        try:
            entry: Entry | None = self.entry(trial.params)
        except (KeyError, TypeError, ValueError):
            entry = None
        if key is not None:
            self._trial_entries[key] = entry
        return entry

    def remembered(
        self, trial: optuna.trial.FrozenTrial, read: Callable[[], ExperimentResult]
    ) -> ExperimentResult:
        """The result of finished ``trial`` (``read()`` once: a finished trial stays as it
        is; the study is read again at every decision)."""
        key = _trial_key(trial)
        if key is None:
            return read()
        if key not in self._trial_results:
            self._trial_results[key] = read()
        return self._trial_results[key]

    def name(self, params: Mapping[str, Any]) -> str:
        """The experiment's name (``z2_mbs8_oc1``): the stage, the micro-batch, and each value
        that differs from the config's."""
        return self.name_of(self.entry(params))

    def ds_config(self, params: Mapping[str, Any]) -> dict[str, Any]:
        """The experiment's whole DeepSpeed config: the user's, with the configuration's
        values, the batch triad resolved, ``autotuning`` removed.

        Raises:
            ConfigError: the configuration breaks a rule of the config.
        """
        return self.config_of(self.entry(params))

    def config_of(self, entry: Entry) -> dict[str, Any]:
        """:meth:`ds_config` of a configuration."""
        name = self.name_of(entry)
        if name not in self._configs:  # a config is loaded, checked: kept, once made
            try:
                ds_config = self.config.with_overrides(entry.overrides).to_dict()
            except ConfigError as err:
                self._configs[name] = err
                raise
            ds_config.pop("autotuning", None)
            self._configs[name] = ds_config
        made = self._configs[name]
        if isinstance(made, ConfigError):
            raise made
        return copy.deepcopy(made)

    def params(
        self, entry: Entry, history: History | None = None
    ) -> tuple[dict[str, Any], dict[str, BaseDistribution]]:
        """``entry`` as the parameters :meth:`suggest` would record, with the distributions
        it suggests them from: what a sampler hands Optuna, and a re-measurement's fixed
        parameters."""
        space = self.plan(history)
        variant = entry.variant
        params: dict[str, Any] = {
            STAGE_PARAM: variant.stage,
            MICRO_BATCH_PARAM: entry.micro_batch_size,
        }
        dists: dict[str, BaseDistribution] = {
            STAGE_PARAM: CategoricalDistribution(space.stages),
            MICRO_BATCH_PARAM: IntDistribution(1, max(space.sizes), log=True),
        }
        plans = [p for p in space.plans if p.variant.stage == variant.stage]
        offloads = {p.variant.offload_optimizer for p in plans}
        _add_switch(params, dists, OFFLOAD_PARAM, variant.offload_optimizer, offloads)
        plans = [p for p in plans if p.variant.offload_optimizer == variant.offload_optimizer]
        checkpointing = {p.variant.activation_checkpointing for p in plans}
        _add_switch(
            params, dists, CHECKPOINTING_PARAM, variant.activation_checkpointing, checkpointing
        )
        plan = next((p for p in plans if p.variant == variant), None)
        # A configuration of a variant the space no longer searches (run before the model
        # was known) keeps its own knobs.
        tuned = plan.knobs if plan is not None else tuple((k, (v,)) for k, v in entry.knobs)
        knobs = dict(entry.knobs)
        for key, values in tuned:
            value = knobs.get(key, space.base.get(key))
            params[key] = value
            choices = knob_choices(values, space.base.get(key))
            dists[key] = CategoricalDistribution(knob_choices(choices, value))
        return params, dists


def _trial_key(trial: optuna.trial.FrozenTrial) -> tuple[Any, ...] | None:
    """What tells a finished trial apart from every other, of any study: its number, state
    and times (None for one still running: it changes)."""
    if not trial.state.is_finished():
        return None
    return (trial.number, trial.state, trial.datetime_start, trial.datetime_complete)


def knob_choices(values: tuple[Any, ...], own: Any) -> tuple[Any, ...]:
    """What a knob is suggested from: the values searched, and the config's own (a
    configuration at the config's knobs is one of the space's too).

    Example:
        >>> knob_choices((10, 100), 50), knob_choices((10, 100), 100)
        ((10, 50, 100), (10, 100))
    """
    if own in values or own is None:
        return tuple(values)
    numeric = all(isinstance(v, int | float) and not isinstance(v, bool) for v in (*values, own))
    return tuple(sorted((*values, own))) if numeric else (*values, own)


def _switch(trial: optuna.Trial, param: str, options: set[bool]) -> bool:
    """A variant's switch: the trial's choice where both are searched; recorded where only
    on is (Optuna takes a single choice without asking the sampler); off, unrecorded, else."""
    if options == {False}:
        return False
    return bool(trial.suggest_categorical(param, (True,) if options == {True} else (False, True)))


def _add_switch(
    params: dict[str, Any],
    dists: dict[str, BaseDistribution],
    param: str,
    value: bool,
    options: set[bool],
) -> None:
    """``param`` as :func:`_switch` records it (``value`` among the choices: a variant the
    space no longer searches keeps its own)."""
    options = options | {value}
    if options == {False}:
        return
    params[param] = value
    dists[param] = CategoricalDistribution((True,) if options == {True} else (False, True))


def _as_model_info(info: ModelInfo | Mapping[str, Any] | None) -> ModelInfo | None:
    if info is None:
        return None
    from autotune.profiling.model_info import ModelInfo

    if isinstance(info, ModelInfo):
        return info
    try:
        return ModelInfo(**dict(info))
    except TypeError as err:
        raise ConfigError("model_info", f"not a model's sizes: {err}") from None


def _measured(history: History | None, space: SearchSpace) -> ModelInfo | None:
    """The model's sizes as the first result in ``history`` that measured them (a script's)."""
    if history is None:
        return None
    from autotune.profiling.model_info import ModelInfo

    world_size = space.config.world_size
    for result in history.results.values():
        info = ModelInfo.from_metrics(result.metrics, world_size)
        if info is not None:
            return info
    return None


def _profiled(config: Config, workload: str, args: Mapping[str, Any]) -> ModelInfo:
    from autotune.profiling.model_info import profile_workload

    return profile_workload(config, workload, args)
