"""What failed experiments say of the rest of the space.

An ``oom`` is a constraint: every larger micro-batch with the same stage and knobs is pruned
unrun. A script that ran out of data (it ended early,
:attr:`~autotune.experiment.ExperimentResult.ended_early`: its loader has fewer batches at
that micro-batch than the profile window needs) bounds every variant alike: that micro-batch
and every larger one are pruned everywhere; where the run said a rank's share of the data
(:attr:`~autotune.experiment.ExperimentResult.samples_per_rank`), every micro-batch over
it. A script that ends after as many steps whatever the micro-batch has a step limit of
its own, which no config changes.
"""

from __future__ import annotations

import itertools
from typing import Any

from autotune.experiment import Status
from autotune.tuner.history import History
from autotune.tuner.reasons import NotRunKind, NotRunReason, Unrun, UnrunKind
from autotune.tuner.space import Variant


class Bounds:
    """The bounds failures set on the space, from the results in ``history``."""

    def __init__(self, history: History) -> None:
        self._history = history
        # Per variant and knobs, the run at the smallest micro-batch that ran out of memory.
        self._oom_floor: dict[tuple[Variant, tuple[tuple[str, Any], ...]], str] = {}
        # The smallest micro-batch a run's script ran out of data at (its own, or one over
        # the rank's share of the data it said) → the first such run, and the sizes that ran
        # ok in any variant: together the bound on every variant (see data_ceiling).
        self._out_of_data: dict[int, str] = {}
        self._ok_sizes: set[int] = set()
        for name in history.order:
            self._note(name)

    def _note(self, name: str) -> None:
        """Learn from ``name``'s result (a configuration's first measurement)."""
        entry, result = self._history.entries.get(name), self._history.results.get(name)
        if entry is None or result is None:
            return
        if result.status is Status.oom:
            key = (entry.variant, entry.knobs)
            floor = self._oom_floor.get(key)
            if floor is None or entry.micro_batch_size < self._size(floor):
                self._oom_floor[key] = name
        if result.ok:
            self._ok_sizes.add(entry.micro_batch_size)
        elif result.ended_early:
            size = entry.micro_batch_size
            if result.samples_per_rank is not None:
                size = min(size, result.samples_per_rank + 1)
            self._out_of_data.setdefault(size, name)

    def oom_pruner(self, name: str) -> str | None:
        """The experiment that ran out of memory at a micro-batch no larger than ``name``'s."""
        entry = self._history.entries.get(name)
        if entry is None:
            return None
        floor = self._oom_floor.get((entry.variant, entry.knobs))
        if floor is None or self._size(floor) > entry.micro_batch_size:
            return None
        return floor

    def oom_floor_size(self, variant: Variant, knobs: tuple[tuple[str, Any], ...]) -> int | None:
        """The smallest micro-batch of ``variant`` with ``knobs`` that ran out of memory."""
        floor = self._oom_floor.get((variant, knobs))
        return None if floor is None else self._size(floor)

    def data_ceiling(self) -> str | None:
        """The run that set the smallest micro-batch where the script runs out of data, above
        every size that ran ok (one that ran ok had data enough, whatever ended another)."""
        ceiling = self._ceiling()
        return None if ceiling is None else ceiling[1]

    def data_ceiling_size(self) -> int | None:
        """The smallest micro-batch where the script runs out of data (see data_ceiling)."""
        ceiling = self._ceiling()
        return None if ceiling is None else ceiling[0]

    def _ceiling(self) -> tuple[int, str] | None:
        if self.step_limit() is not None:  # the script stops itself: no data bound shown
            return None
        largest_ok = max(self._ok_sizes, default=0)
        sizes = [size for size in self._out_of_data if size > largest_ok]
        return (min(sizes), self._out_of_data[min(sizes)]) if sizes else None

    def data_pruner(self, name: str) -> str | None:
        """The run that set a data bound at a micro-batch no larger than ``name``'s."""
        entry, ceiling = self._history.entries.get(name), self._ceiling()
        if entry is None or ceiling is None:
            return None
        return ceiling[1] if entry.micro_batch_size >= ceiling[0] else None

    def pruned(self) -> dict[Unrun, NotRunReason]:
        """Why each configuration considered and not run that a bound prunes is pruned: the
        data bound (once for all variants, then each configuration), then an ``oom`` below."""
        return {**self._pruned_by_data(), **self._pruned_by_oom()}

    def _pruned_by_oom(self) -> dict[Unrun, NotRunReason]:
        return {
            Unrun.configuration(name): NotRunReason(NotRunKind.oom_below, (floor,))
            for name in self._history.entries
            if name not in self._history.results and (floor := self.oom_pruner(name)) is not None
        }

    def _pruned_by_data(self) -> dict[Unrun, NotRunReason]:
        bound = self._ceiling()
        if bound is None:
            return {}
        size, ceiling = bound
        pruned = {
            Unrun(UnrunKind.sizes_from, size=size): NotRunReason(
                NotRunKind.out_of_data, (size, ceiling)
            )
        }
        pruned.update(
            (Unrun.configuration(name), NotRunReason(NotRunKind.data_bound, (size, ceiling)))
            for name, entry in self._history.entries.items()
            if name not in self._history.results and entry.micro_batch_size >= size
        )
        return pruned

    def step_limit(self) -> int | None:
        """The steps the script ends after at two micro-batches that running out of data
        cannot explain, or None.

        Data for ``s`` steps of ``m1`` but not ``s + 1`` holds fewer than ``(s + 1) * m1``
        samples per rank, so at ``m2`` it gives ``s`` steps only if ``s * m2 < (s + 1) * m1``;
        otherwise the script stops itself.
        """
        ended = sorted(
            (r.ended_after_steps, self._size(n))
            for n, r in self._history.results.items()
            if r.ended_after_steps is not None and n in self._history.entries
        )
        for (steps, small), (same, large) in itertools.pairwise(ended):
            if steps == same and large * steps >= small * (steps + 1):
                return steps
        return None

    def _size(self, name: str) -> int:
        return self._history.entries[name].micro_batch_size
