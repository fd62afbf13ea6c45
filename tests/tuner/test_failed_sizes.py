"""An ``error`` or a ``timeout`` is a verdict on its own micro-batch only: the search for the
largest that fits steps over it (only an ``oom`` bounds it), a list the user wrote runs
whole, and every configuration the tuner considered and did not run is listed with why."""

from __future__ import annotations

from collections.abc import Mapping

from autotune.config import load_config
from autotune.experiment import ExperimentResult, Status
from autotune.summary_text import not_run_texts, notes
from autotune.tuner import Candidate, Tuner
from autotune.tuner.probe import MAX_FAILED_SIZES
from tests.tuner.landscape import MODEL, Landscape, drive, true_largest_fit

FAULTS = {2: Status.error, 3: Status.timeout, 5: Status.error, 6: Status.error, 7: Status.oom}


class FaultyAt(Landscape):
    """The landscape, with the statuses ``faults`` names at those micro-batches."""

    def __init__(self, faults: Mapping[int, Status]) -> None:
        super().__init__()
        self.faults = faults

    def run(self, candidate: Candidate) -> ExperimentResult:
        status = self.faults.get(candidate.micro_batch_size)
        if status is None:
            return super().run(candidate)
        # Worded differently at each size, as failures that are not the script's alone are.
        wording = "abcdefghijklmnopqrstuvwxyz"[candidate.micro_batch_size % 26]
        return ExperimentResult(candidate.name, status, error=f"{status.value}: case {wording}")


def listed_tuner(sizes: list[int], **autotuning: object) -> Tuner:
    config = {
        "train_micro_batch_size_per_gpu": sizes,
        "zero_optimization": {"stage": 0},
        "autotuning": {"tuner_type": "gridsearch", **autotuning},
    }
    return Tuner(load_config(config, 2), MODEL, device_memory_bytes=Landscape().budget_bytes)


def test_every_listed_size_runs_past_errors_and_timeouts() -> None:
    tuner = listed_tuner([1, 2, 3, 4, 5, 6, 7])
    asked = drive(tuner, FaultyAt(FAULTS))
    statuses = {c.micro_batch_size: FaultyAt(FAULTS).run(c).status for c in asked}
    assert statuses == {1: Status.ok, 4: Status.ok, **FAULTS}
    summary = tuner.summary()
    assert summary.best is not None and summary.best.name in ("z0_mbs1", "z0_mbs4")
    assert summary.not_run == {}, summary.not_run


def test_an_oom_prunes_the_larger_listed_sizes_and_says_so() -> None:
    landscape = FaultyAt({4: Status.error})
    assert 16 <= true_largest_fit(landscape, 0) < 32  # the search starts at 16, 32 is an oom
    tuner = listed_tuner([1, 2, 4, 8, 16, 32, 64])
    drive(tuner, landscape)
    pruned = not_run_texts(tuner.summary())
    assert pruned == {"z0_mbs64": "larger than z0_mbs32, which ran out of memory"}


def test_the_default_search_steps_over_errors_up_to_a_bound_and_lists_it() -> None:
    landscape = Landscape()
    fit = true_largest_fit(landscape, 0)
    # Sizes from 3 up to the real fit fail for a reason that is not memory.
    faults = {size: Status.error for size in range(3, fit + 1)}
    tuner = Tuner(
        load_config({"zero_optimization": {"stage": 0}, "autotuning": {"num_remeasure": 0}}, 2),
        MODEL,
        device_memory_bytes=landscape.budget_bytes,
    )
    asked = drive(tuner, FaultyAt(faults))
    errors = sorted(c.micro_batch_size for c in asked if c.micro_batch_size in faults)
    assert len(errors) >= MAX_FAILED_SIZES, errors
    summary = tuner.summary()
    assert summary.best is not None and summary.best.name == "z0_mbs2"
    (bound,) = [
        why for key, why in not_run_texts(summary).items() if key.startswith("z0 micro-batch")
    ]
    assert bound.startswith(f"not searched: {len(errors)} sizes above 2 failed"), bound


def test_configurations_never_reached_are_listed_with_why() -> None:
    tuner = listed_tuner([1, 2, 3, 4, 5, 6, 7, 8], tuner_num_trials=3, num_remeasure=0)
    drive(tuner, Landscape())
    summary = tuner.summary()
    unreached = {name: why for name, why in not_run_texts(summary).items() if "not reached" in why}
    assert len(unreached) == 8 - 3, not_run_texts(summary)
    assert all("tuner_num_trials (3) reached" in why for why in unreached.values())


def test_a_best_at_the_largest_size_allowed_is_said_to_be_so() -> None:
    tuner = listed_tuner([1, 2, 4], num_remeasure=0)
    drive(tuner, Landscape())  # every size fits; the largest is the fastest
    summary = tuner.summary()
    assert summary.best is not None and summary.best.name == "z0_mbs4"
    (note,) = [line for line in notes(summary) if "larger one may be faster" in line]
    assert "micro-batch 4, the largest listed in train_micro_batch_size_per_gpu" in note
    roomy = listed_tuner([1, 2, 4, 64], num_remeasure=0)  # 64 runs out of memory
    drive(roomy, Landscape())
    assert roomy.summary().best_at_cap is None
