"""Tuners the tuner tests share: a small tuning problem on the synthetic landscape, and a
fast gridsearch over the whole default space."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import optuna

from autotune.config import Config, Metric, load_config
from autotune.tuner import Tuner
from autotune.tuner.trials import new_study
from autotune.tuner.warm_start import WarmStart
from tests.tuner.landscape import MODEL, FakeClock, Landscape

TUNERS = ("gridsearch", "random", "model_based")


def small_config(tuner_type: str, stages: tuple[int, ...] = (1, 2), **autotuning: Any) -> Config:
    """Stages 1 and 2, three micro-batches each, two knobs the user lists: 24 points."""
    return load_config(
        {
            "optimizer": {"type": "AdamW", "params": {"lr": 1e-4}},
            "zero_optimization": {
                "stage": list(stages),
                "reduce_bucket_size": [1_000_000, 20_000_000],
                "overlap_comm": [False, True],
            },
            "autotuning": {
                "tuner_type": tuner_type,
                "max_train_micro_batch_size_per_gpu": 64,
                "tuner_early_stopping": 1000,
                "tuner_num_trials": 1000,
                **autotuning,
            },
        },
        world_size=2,
    )


def small_tuner(
    tuner_type: str,
    clock: FakeClock | None = None,
    study: optuna.Study | None = None,
    stages: tuple[int, ...] = (1, 2),
    warm_start: WarmStart | None = None,
    sampler: optuna.samplers.BaseSampler | None = None,
    **autotuning: Any,
) -> Tuner:
    return Tuner(
        small_config(tuner_type, stages, **autotuning),
        MODEL,
        device_memory_bytes=Landscape().budget_bytes,
        clock=clock or FakeClock(),
        study=study,
        warm_start=warm_start,
        sampler=sampler,
    )


def stored_study(metric: Metric = Metric.throughput) -> Callable[[], optuna.Study]:
    """A study in a storage that outlives each tuner: every call loads it again, as a
    resumed run does from its results directory."""
    storage = optuna.storages.InMemoryStorage()
    return lambda: new_study(metric, storage=storage, name="run")


def fast_tuner(budget: int | None, **autotuning: object) -> Tuner:
    raw = {"autotuning": {"tuner_type": "gridsearch", "num_remeasure": 0, **autotuning}}
    return Tuner(load_config(raw, 2), MODEL, device_memory_bytes=budget)
