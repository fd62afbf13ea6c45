"""The tunable keys, one row each: everything that lists knobs derives from :data:`KNOBS`.

A row says how a key is spelled in experiment names, at which ZeRO stages the built-in engine
reads it, and what the tuner tries by default. The config takes search lists at the rows'
keys, the tuner tunes a knob only at the stages its row lists (elsewhere two values would
differ only by noise) and names candidates in the table's order, and the results table has a
column per row. ``tests/engine/test_knob_agreement.py`` checks every row's stages against the
engine: the knob changes what the engine does at each listed stage and nothing at the others.

Adding a knob: the engine code that reads it, then a row here (and the two values the
agreement test compares it at).

Torch-free, so the config and the tuner both import it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

ALL_STAGES = (0, 1, 2, 3)

STAGE_KEY = "zero_optimization.stage"
OFFLOAD_KEY = "zero_optimization.offload_optimizer.device"
MICRO_BATCH_KEY = "train_micro_batch_size_per_gpu"
ACCUMULATION_KEY = "gradient_accumulation_steps"
CHECKPOINTING_KEY = "activation_checkpointing.enabled"


@dataclass(frozen=True)
class Knob:
    """One tunable key.

    Attributes:
        key: the dotted config key, in DeepSpeed's spelling.
        abbreviation: its prefix in experiment names (``rbs`` in ``z1_mbs4_rbs5e7``).
        value_type: what its values are (``int`` sizes may also be ``"auto"`` in a config).
        stages: the ZeRO stages at which the engine reads it; a user's list is tuned there
            and left at its first value elsewhere. Empty: accepted, but without effect.
        default_stages: where the tuner tunes it unasked (``fast: false``).
        default_grid: the values tried there.
        scales_with_model: the grid is in elements and sizes at or above the model's
            parameter count behave alike, so the tuner fits the grid to the model.
        searchable: the config may give a list of values to search at this key.
        per_stage: tuned per stage in the knob phase; the stage, the micro-batch and the
            offload choice are the tuner's own axes, searched before.
        recommended: the value established practice sets where it differs from the config's
            own (None: keep the config's); ``model_based`` tries it before searching.
    """

    key: str
    abbreviation: str
    value_type: type
    stages: frozenset[int]
    default_stages: frozenset[int] = frozenset()
    default_grid: tuple[Any, ...] = ()
    scales_with_model: bool = False
    searchable: bool = True
    per_stage: bool = True
    recommended: Any = None

    def __post_init__(self) -> None:
        # A default tuned where the engine does not read it would run experiments that
        # differ only by noise.
        if not self.default_stages <= self.stages:
            raise ValueError(f"{self.key}: tuned by default at stages the engine ignores")
        if bool(self.default_grid) != bool(self.default_stages):
            raise ValueError(f"{self.key}: a default grid needs default stages and vice versa")
        if not all(type(v) is self.value_type for v in self.default_grid):
            raise ValueError(f"{self.key}: default grid values must be {self.value_type}")


_Z = "zero_optimization."
_STAGES_1_2 = frozenset({1, 2})
_BUCKETS = (50_000_000, 500_000_000, 1_000_000_000)  # DeepSpeed's autotuner's bucket sizes
_SWITCHES = (True, False)


def _stage3(
    name: str, abbreviation: str, grid: tuple[int, ...] = (), scales_with_model: bool = False
) -> Knob:
    """A ``stage3_*`` size: read at stage 3 only, tuned there by default if it has a grid."""
    default_stages = frozenset({3}) if grid else frozenset()
    return Knob(
        f"{_Z}stage3_{name}",
        abbreviation,
        int,
        frozenset({3}),
        default_stages,
        grid,
        scales_with_model,
    )


# In name order: a candidate's name lists its keys in this order.
KNOBS: tuple[Knob, ...] = (
    Knob(STAGE_KEY, "z", int, frozenset(ALL_STAGES), per_stage=False),
    Knob(OFFLOAD_KEY, "o", str, frozenset({1, 2, 3}), searchable=False, per_stage=False),
    Knob(MICRO_BATCH_KEY, "mbs", int, frozenset(ALL_STAGES), per_stage=False),
    # The model recomputes its activations in backward: less memory, a third more compute.
    # The workload does it (a built-in or hf: workload switches it on; a script gets it
    # through autotuning.arg_mappings, e.g. onto --gradient_checkpointing), at every stage.
    # Like offload it is a variant of its own, with its own largest micro-batch, not a knob
    # tuned at one micro-batch: at the same micro-batch it can only be slower.
    Knob(CHECKPOINTING_KEY, "ac", bool, frozenset(ALL_STAGES), per_stage=False),
    Knob(ACCUMULATION_KEY, "gas", int, frozenset(ALL_STAGES)),
    # Stages 0-2 cut the flat buffer into buckets of this size; stage 3 groups modules by it.
    Knob(
        _Z + "reduce_bucket_size",
        "rbs",
        int,
        frozenset(ALL_STAGES),
        _STAGES_1_2,
        _BUCKETS,
        scales_with_model=True,
    ),
    # The all-gather of updated shards after the step (stage 3 gathers per module instead).
    Knob(
        _Z + "allgather_bucket_size",
        "agbs",
        int,
        _STAGES_1_2,
        _STAGES_1_2,
        _BUCKETS,
        scales_with_model=True,
    ),
    # DeepSpeed's ZeRO-2 examples and its stage-3 default overlap the reduction with backward.
    Knob(
        _Z + "overlap_comm",
        "oc",
        bool,
        frozenset(ALL_STAGES),
        frozenset({2}),
        _SWITCHES,
        recommended=True,
    ),
    # Stage 0 all-reduces: every rank needs the whole gradient.
    Knob(_Z + "reduce_scatter", "rs", bool, frozenset({1, 2, 3}), frozenset({2}), _SWITCHES),
    # Only partitioned gradients (stages 2-3) are packed into bucket buffers.
    Knob(_Z + "contiguous_gradients", "cg", bool, frozenset({2, 3}), frozenset({2}), _SWITCHES),
    Knob(_Z + "allgather_partitions", "agp", bool, _STAGES_1_2),
    # Bucket order is fixed and the same on every rank: nothing for it to change.
    Knob(_Z + "round_robin_gradients", "rrg", bool, frozenset()),
    _stage3("prefetch_bucket_size", "pfb", (5_000_000, 50_000_000, 500_000_000), True),
    _stage3("param_persistence_threshold", "ppt", (10_000, 100_000, 1_000_000)),
    _stage3("max_live_parameters", "mlp", (100_000_000, 500_000_000, 1_000_000_000), True),
    _stage3("max_reuse_distance", "mrd"),
    # The optimizer steps this rank's owned elements in pieces of this size, at every stage.
    Knob(_Z + "sub_group_size", "sgs", int, frozenset(ALL_STAGES)),
)

KNOB_BY_KEY: dict[str, Knob] = {knob.key: knob for knob in KNOBS}

# Keys whose value may be a list of values to search (DeepSpeed's autotuner allows the same).
SEARCHABLE_KEYS: tuple[str, ...] = tuple(knob.key for knob in KNOBS if knob.searchable)


def name_position(key: str) -> int:
    """Where ``key`` goes in a candidate's name: the table's order, unknown keys last.

    Example:
        >>> name_position("zero_optimization.stage"), name_position("fp16.enabled")
        (0, 17)
    """
    return _POSITIONS.get(key, len(KNOBS))


_POSITIONS = {knob.key: position for position, knob in enumerate(KNOBS)}
