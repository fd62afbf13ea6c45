"""model_based on a landscape shaped like real measurements: near the grid's best, in two
fifths of the grid's experiments (median over 10 seeds).

Why two fifths: finding each variant's largest micro-batch exactly costs about two
experiments per variant beyond the memory estimate, and model_based spends 8 experiments on
the knobs of the variant its prior favours before searching the others (which halves the
experiments to a near-best configuration on the measured gpt_vocab landscape, see the
README); here every variant is within a few per cent of the others and the favourite is not
the best, so those 8 buy nothing. The race among the
re-measured comes on top: its length follows the noise (3% here), not the search."""

from __future__ import annotations

import statistics

from autotune.config import load_config
from autotune.tuner import Tuner
from autotune.tuner.remeasure import MAX_RACE_ROUNDS, MAX_REMEASURE_FACTOR
from tests.tuner.landscape import MODEL, Landscape, drive

SEEDS = range(10)
NUM_REMEASURE, NUM_REPEATS = 2, 2


def tuner(
    tuner_type: str, seed: int, num_trials: int, num_remeasure: int, patience: int = 10
) -> Tuner:
    raw = {
        "autotuning": {
            "fast": False,  # stages × micro-batches × every stage's knobs
            "tuner_type": tuner_type,
            "seed": seed,
            "tuner_num_trials": num_trials,
            "tuner_early_stopping": patience,
            "num_remeasure": num_remeasure,
            "max_train_micro_batch_size_per_gpu": 64,
        }
    }
    budget = Landscape().budget_bytes
    return Tuner(load_config(raw, 2), MODEL, device_memory_bytes=budget, num_repeats=NUM_REPEATS)


def test_model_based_reaches_97_percent_of_the_grid_optimum_in_two_fifths_of_its_size() -> None:
    truth = Landscape()  # noise-free: how good a configuration really is
    grid = drive(tuner("gridsearch", 0, 10_000, 0, patience=10_000), Landscape(noise=0.03))
    optimum = max(truth.throughput(c.ds_config) for c in grid if truth.run(c).ok)
    allowed = len(grid) * 2 // 5  # every experiment counts, the fixed re-measurements included
    race = MAX_REMEASURE_FACTOR * NUM_REMEASURE * MAX_RACE_ROUNDS  # the most the race adds

    ratios, used = [], []
    for seed in SEEDS:
        search = allowed - MAX_REMEASURE_FACTOR * NUM_REMEASURE * NUM_REPEATS
        model_based = tuner("model_based", seed, search, NUM_REMEASURE)
        used.append(len(drive(model_based, Landscape(noise=0.03, seed=seed))))
        best = model_based.optimal_config()
        assert best is not None
        ratios.append(truth.throughput(best) / optimum)

    print(f"grid {len(grid)} experiments; model_based ratios {sorted(ratios)}, used {used}")
    assert max(used) <= allowed + race
    assert statistics.median(ratios) >= 0.97
