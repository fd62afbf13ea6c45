"""The script-facing API on two ranks: checkpoints resume bit-for-bit at every stage and
precision, other shapes are refused, a save that dies halfway never becomes what ``latest``
names; GatheredParameters keeps a modifier's edit; a client optimizer is sharded correctly."""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from autotune.engine import initialize
from autotune.engine.checkpoint import MODEL_STATES, CheckpointError
from tests.engine import script_cases as cases
from tests.engine.rank_pool import RankPool


@pytest.fixture(scope="module")
def pool() -> Iterator[RankPool]:
    ranks = RankPool(world_size=2)
    yield ranks
    ranks.close()


@pytest.mark.multirank
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_resume_is_bit_for_bit(pool: RankPool, tmp_path: Path, stage: int, precision: str) -> None:
    pool.run(cases.resume_matches, cases.resume_config(stage, precision), str(tmp_path), 2, 4)


@pytest.mark.multirank
def test_resume_with_fp16_and_offload(pool: RankPool, tmp_path: Path) -> None:
    config = cases.resume_config(2, "fp16")
    config["zero_optimization"]["offload_optimizer"] = {"device": "cpu"}
    pool.run(cases.resume_matches, config, str(tmp_path), 2, 4)


@pytest.mark.multirank
@pytest.mark.parametrize(("stage", "precision"), [(0, "fp32"), (2, "bf16"), (3, "fp32")])
def test_a_checkpoint_is_resharded_to_another_stage_or_world_size(
    pool: RankPool, tmp_path: Path, stage: int, precision: str
) -> None:
    tolerance = 1e-6 if precision == "fp32" else 4e-3  # bf16 weights: a rounding step
    for differences in pool.run(cases.reshards, str(tmp_path), stage, precision):
        assert len(differences) == 4 and max(differences) <= tolerance, differences


@pytest.mark.multirank
def test_other_precision_optimizer_and_torn_saves_are_refused(
    pool: RankPool, tmp_path: Path
) -> None:
    for errors in pool.run(cases.refuses_other_shapes, str(tmp_path)):
        precision, optimizer, torn = errors
        assert "saved with precision fp32, this run has bf16" in precision
        assert "saved with optimizer AdamW, this run has SGD" in optimizer
        assert "different saves" in torn or "another rank" in torn


@pytest.mark.multirank
@pytest.mark.parametrize("stage", [1, 3])
def test_gathered_parameters_keep_the_modifiers_edit(pool: RankPool, stage: int) -> None:
    means = pool.run(cases.gathered_parameters_modify, stage)
    assert means[0] == means[1]
    assert means[0][1] < 0.1  # one small step away from the edit, on both ranks


def _engine(stage: int = 2) -> torch.nn.Module:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Linear(8, 1))
    config = {"train_micro_batch_size_per_gpu": 2, "zero_optimization": {"stage": stage}}
    return initialize(model=model, config=config)[0]


def _step(engine: torch.nn.Module) -> None:
    engine.backward(engine(torch.ones(2, 4)).pow(2).mean())
    engine.step()


def test_no_checkpoint_yet_returns_none_and_warns_of_nothing(tmp_path: Path) -> None:
    # A fresh start of a script that resumes when it can: every rank would print a warning.
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert _engine().load_checkpoint(tmp_path) == (None, None)
    with pytest.raises(CheckpointError, match="missing"):
        _engine().load_checkpoint(tmp_path, tag="nope")


def test_a_save_killed_halfway_leaves_latest_on_the_last_complete_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = _engine()
    _step(engine)
    engine.save_checkpoint(tmp_path, tag="one", client_state={"n": 1})
    _step(engine)
    real_save = torch.save

    def dies_on_model_states(obj: object, handle: object) -> None:
        if "client_state" in obj:  # type: ignore[operator]
            raise KeyboardInterrupt  # killed while writing the model states file
        real_save(obj, handle)  # type: ignore[arg-type]

    monkeypatch.setattr(torch, "save", dies_on_model_states)
    with pytest.raises(KeyboardInterrupt):
        engine.save_checkpoint(tmp_path, tag="two")
    monkeypatch.undo()
    assert (tmp_path / "latest").read_text() == "one"
    engine.save_checkpoint(tmp_path, tag="aside", save_latest=False)
    assert (tmp_path / "latest").read_text() == "one"
    assert not (tmp_path / "two" / MODEL_STATES).exists()  # the save died writing it
    assert not [p for p in tmp_path.rglob("*.tmp")]  # no temporary left behind
    fresh = _engine()
    path, client = fresh.load_checkpoint(tmp_path)
    assert client == {"n": 1} and fresh.global_steps == 1 and path == str(tmp_path / "one")
    with pytest.raises(CheckpointError, match="missing"):
        fresh.load_checkpoint(tmp_path, tag="two")


@pytest.mark.multirank
@pytest.mark.parametrize("stage", [1, 3])
def test_client_optimizer_instance_is_sharded_correctly(pool: RankPool, stage: int) -> None:
    pool.run(cases.client_optimizer_matches, stage)


@pytest.mark.multirank
@pytest.mark.parametrize("persistence_threshold", [0, 40])
def test_zero3_ds_tensors_are_each_ranks_part_of_the_parameter(
    pool: RankPool, persistence_threshold: int
) -> None:
    """A parameter's ``ds_tensor`` on rank 0 then rank 1 is the whole of it (a module's
    parameters split at one point, small ones sharing the persistent unit)."""
    first, second = pool.run(cases.zero3_local_pieces, persistence_threshold)
    for name, (piece, numel, ds_numel, shape, whole) in first.items():
        rest = second[name][0]
        assert piece + rest == whole, name
        assert numel == len(piece) and ds_numel == len(whole) == int(torch.tensor(shape).prod())
