"""What a search hands the driver (a :class:`Decision`), the driver's next :class:`Step` by the
stopping rules, and what the driver hands a runner: a :class:`Candidate` to run, proposed in a
:class:`Phase`."""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from autotune.config.knobs import MICRO_BATCH_KEY, STAGE_KEY

if TYPE_CHECKING:
    from autotune.tuner.history import Entry
    from autotune.tuner.reasons import StopReason


class Phase(str, enum.Enum):
    """Where the tuner is; the phases are described in :mod:`autotune.tuner.tuner`."""

    max_micro_batch = "max_micro_batch"
    micro_batch = "micro_batch"
    knobs = "knobs"
    remeasure = "remeasure"
    done = "done"
    model = "model"  # model_based's one search phase (after the others: they keep their seeds)
    sampler = "sampler"  # an Optuna sampler the user passed, over the whole space


# The order the phases run in: gridsearch and random sample each phase in turn; model_based
# searches the whole space at once with its cost model (:mod:`autotune.tuner.model_search`).
PHASES = list(Phase)
SAMPLED_PHASES = (
    Phase.max_micro_batch,
    Phase.micro_batch,
    Phase.knobs,
    Phase.remeasure,
    Phase.done,
)
MODEL_PHASES = (Phase.model, Phase.remeasure, Phase.done)
SAMPLER_PHASES = (Phase.sampler, Phase.remeasure, Phase.done)


@dataclass(frozen=True)
class Candidate:
    """An experiment the tuner wants run.

    Attributes:
        name: unique and stable across runs; the experiment's folder name.
        overrides: the dotted-key values applied to the user's config.
        ds_config: the concrete config to run (batch triad resolved, ``autotuning`` removed).
        phase: the phase that proposed it.
        repeat_of: for a re-measurement, the name of the original.
        stop_above_step_s: the step time above which it cannot come within the tolerance of
            the best so far: its window ends there (None: the whole window runs).
        number: its place in the order the tuner proposed experiments, kept across resumed
            runs (None: not proposed yet).
    """

    name: str
    overrides: Mapping[str, Any]
    ds_config: Mapping[str, Any]
    phase: Phase
    repeat_of: str | None = None
    stop_above_step_s: float | None = None
    number: int | None = None

    @property
    def stage(self) -> int:
        return int(self.overrides[STAGE_KEY])

    @property
    def micro_batch_size(self) -> int:
        return int(self.overrides[MICRO_BATCH_KEY])


class DecisionKind(str, enum.Enum):
    propose = "propose"  # measure ``Decision.name`` next
    ask = "ask"  # ask the study's own sampler (one the user passed) what to measure
    wait = "wait"  # nothing until a result in flight is in
    end = "end"  # the search is over (``Decision.stop``: why)


@dataclass(frozen=True)
class Decision:
    """What a search wants next.

    Attributes:
        kind: propose, ask, wait or end.
        phase: the phase the walk reached.
        name: the configuration to measure (propose).
        entry: its configuration (propose).
        stop: why the search ended (end).
        confirm_leader: the search ended because nothing left could beat the leader as
            measured: measuring it again may give it more to measure (``model_based``).
    """

    kind: DecisionKind
    phase: Phase
    name: str | None = None
    entry: Entry | None = None
    stop: StopReason | None = None
    confirm_leader: bool = False

    @classmethod
    def propose(cls, entry: Entry, name: str, phase: Phase) -> Decision:
        return cls(DecisionKind.propose, phase, name, entry)


class StepKind(str, enum.Enum):
    """What the driver does next (:class:`Step`)."""

    run = "run"  # run ``Step.name``: a search's proposal, or a re-measurement
    ask = "ask"  # ask the study's own sampler (one the user passed)
    wait = "wait"  # for a result in flight
    quiet = "quiet"  # for a busy machine to quiet down, ``Step.wait_s`` at most
    end_search = "end_search"  # the search is over (``Step.stop``; ``Step.left``: not run)
    end_run = "end_run"  # the run is over


@dataclass(frozen=True)
class Step:
    """The driver's next step, as :class:`Stopping` decides it."""

    kind: StepKind
    phase: Phase
    name: str | None = None
    entry: Entry | None = None
    repeat_of: str | None = None
    stop: StopReason | None = None
    left: str | None = None
    wait_s: float | None = None
