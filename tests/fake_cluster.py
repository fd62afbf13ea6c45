"""A fake concurrent runner for the tuning loop: room for several experiments at once, results
in a seeded random order, and an interruption on demand."""

from __future__ import annotations

import random
from dataclasses import replace

from autotune.experiment import ExperimentResult, ExperimentSpec, Metrics, Status
from tests.runner.sim_cluster import config_metrics


class FakeCluster:
    """Room for ``fits`` experiments; finishes them in a seeded random order."""

    def __init__(
        self,
        fits: int = 3,
        uses_gpus: bool = True,
        interrupt_after: int = 0,
        disturbed: bool = False,
    ) -> None:
        self.fits, self.uses_gpus = fits, uses_gpus
        self.disturbed = disturbed  # a neighbour slows every experiment to 0.6 (seen)
        self.in_flight: list[ExperimentSpec] = []
        self.most_in_flight = 0
        self.finished = 0
        self.cancelled: list[str] = []
        self._interrupt_after = interrupt_after
        self._order = random.Random(0)

    def capacity(self, world_size: int, cpus_per_rank: int = 1) -> int:
        return self.fits

    def submit(self, spec: ExperimentSpec) -> None:
        self.in_flight.append(spec)
        self.most_in_flight = max(self.most_in_flight, len(self.in_flight))

    def wait(self) -> list[ExperimentResult]:
        if self._interrupt_after and self.finished == self._interrupt_after:
            raise KeyboardInterrupt
        spec = self.in_flight.pop(self._order.randrange(len(self.in_flight)))
        self.finished += 1
        metrics = config_metrics(spec)
        if self.disturbed:
            steps = [s / 0.6 for s in metrics.step_times_s]
            slowed = Metrics.from_window(
                steps, metrics.train_batch_size, 1e9, metrics.peak_memory_bytes
            )
            metrics = replace(slowed, oversubscription=0.67)
        return [ExperimentResult(spec.name, Status.ok, metrics)]

    def cancel(self) -> None:
        self.cancelled = [spec.name for spec in self.in_flight]
        self.in_flight.clear()
