"""Checkpoints in DeepSpeed's layout: a model-states file, one shard file per rank, ``latest``.

``save_dir/<tag>/mp_rank_00_model_states.pt`` (rank 0) holds the model's weights (at stage 3
only what is not partitioned: buffers, frozen parameters), the step counters, the scheduler,
the loss scaler and the client state. ``zero_pp_rank_<r>_mp_rank_00_optim_states.pt`` holds
rank ``r``'s optimizer state, its fp32 master copy (bf16/fp16, offload) and, at stage 3, its
parameter shard; at stage 0 every rank holds the same state, so rank 0 writes it once.
Together they restore the exact bits a run had, so training continues as if never stopped.
Loaded at another world size, stage or bucket layout, a checkpoint is re-sharded
(:mod:`autotune.engine.reshard`).

Crash safety: every file is written to a temporary name, fsynced and renamed; the shard files
first, then (after a barrier) the model-states file, then ``latest``. All files of one save
carry the same save id, and loading checks it, so a save killed halfway (say, while
overwriting a tag) is refused rather than loaded as a mix of two saves; ``latest`` still
names the last complete one.
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from torch import nn

from autotune.engine import reshard
from autotune.results.files import atomic_write_text, atomic_writer

if TYPE_CHECKING:
    from autotune.engine.engine import ZeroEngine

FORMAT = 1
LATEST = "latest"
MODEL_STATES = "mp_rank_00_model_states.pt"


class CheckpointError(ValueError):
    """A checkpoint that cannot be loaded into this engine: missing, incomplete, or saved
    with another precision, optimizer or set of trained parameters. (Another world size,
    stage or bucket layout is re-sharded: see :mod:`autotune.engine.reshard`.)"""


def shard_file(rank: int) -> str:
    return f"zero_pp_rank_{rank}_mp_rank_00_optim_states.pt"


def save(
    engine: ZeroEngine,
    save_dir: str | Path,
    tag: str | None,
    client_state: dict[str, Any],
    save_latest: bool = True,
    exclude_frozen: bool = False,
) -> Path:
    """Write a checkpoint of ``engine`` (every rank must call this); returns its folder.

    ``exclude_frozen`` leaves out the parameters the engine does not train (a PEFT model's
    frozen base): loading keeps the model's own values for them.
    """
    tag = str(tag) if tag is not None else f"global_step{engine.global_steps}"
    folder = Path(save_dir) / tag
    save_id = _agree(engine, uuid.uuid4().hex)
    rank, stage = engine.communicator.rank, engine.zero.stage
    if stage > 0 or rank == 0:
        _write(folder / shard_file(rank), {"save_id": save_id, **_shard_state(engine)})
    _barrier(engine)
    if rank == 0:
        state = {
            "save_id": save_id,
            "format": FORMAT,
            "shape": _shape(engine),
            "module": _module_state(engine, exclude_frozen),
            "frozen_excluded": exclude_frozen,
            "global_steps": engine.global_steps,
            "micro_steps": engine.micro_steps,
            "skipped_steps": engine.skipped_steps,
            "global_samples": engine.global_steps * engine.train_batch_size(),
            "lr_scheduler": _scheduler_state(engine.lr_scheduler),
            "loss_scaler": engine.loss_scaler.state_dict(),
            "client_state": dict(client_state),
            "ds_config": engine.config.to_dict(),
            "dp_world_size": engine.communicator.world_size,
        }
        _write(folder / MODEL_STATES, state)
        if save_latest:
            atomic_write_text(Path(save_dir) / LATEST, tag)
    _barrier(engine)
    return folder


def load(
    engine: ZeroEngine,
    load_dir: str | Path,
    tag: str | None,
    load_optimizer_states: bool,
    load_lr_scheduler_states: bool,
    load_module_only: bool,
    load_module_strict: bool = True,
) -> tuple[str | None, dict[str, Any] | None]:
    """Restore ``engine`` from a checkpoint (every rank must call this).

    Parameters the checkpoint left out (saved with ``exclude_frozen``) keep the model's own
    values; with ``load_module_strict`` false, so do any others it lacks, and weights the
    model does not have are ignored, as ``load_state_dict(strict=False)``.

    Returns ``(path, client_state)``, or ``(None, None)`` when there is no ``latest`` to
    follow, as DeepSpeed does on a first run.
    """
    if tag is None:
        latest = Path(load_dir) / LATEST
        if not latest.is_file():
            # A fresh start, which scripts meet on every first run: said by the return value,
            # never a warning from every rank (a tag asked for by name and missing raises).
            return None, None
        tag = latest.read_text(encoding="utf-8").strip()
    folder = Path(load_dir) / tag
    # Each rank reads its own files; they decide together, so that a rank whose shard is
    # bad never leaves the others waiting in a collective.
    try:
        state, shards, same = _read_checked(engine, folder)
        problem = None
    except CheckpointError as err:
        problem = err
    if engine.communicator.any_rank(problem is not None):
        raise problem or CheckpointError(f"{folder}: another rank could not load its shard")
    optimizer_too = load_optimizer_states and not load_module_only
    with torch.no_grad():
        module = _module_to_load(engine, state, load_module_strict)
        if same:
            _restore_same_shape(engine, module, shards[0], optimizer_too)
        else:
            reshard.restore(engine, {**state, "module": module}, shards, optimizer_too)
        if optimizer_too:
            engine.loss_scaler.load_state_dict(state["loss_scaler"])
    if not load_module_only:
        if load_lr_scheduler_states and engine.lr_scheduler is not None:
            if state["lr_scheduler"] is None:
                raise CheckpointError(f"{folder}: saved without a learning-rate scheduler")
            engine.lr_scheduler.load_state_dict(state["lr_scheduler"])
        engine.global_steps = state["global_steps"]
        engine.micro_steps = state["micro_steps"]
        engine.skipped_steps = state["skipped_steps"]
    _barrier(engine)
    return str(folder), state["client_state"]


# --- what is saved -----------------------------------------------------------------------------


def _shape(engine: ZeroEngine) -> dict[str, Any]:
    """What must match for a rank's shard to mean the same thing when loaded."""
    layout = engine.layout
    return {
        "world_size": engine.communicator.world_size,
        "stage": engine.zero.stage,
        "precision": engine.config.precision,
        "param_names": reshard.param_names(engine),
        "param_numels": list(layout.param_numels),
        "segments": [(s.first_param, s.end_param) for s in layout.segments],
        "optimizer": type(engine.optimizer).__name__,
    }


def _module_state(engine: ZeroEngine, exclude_frozen: bool) -> dict[str, torch.Tensor]:
    """The model's state dict, less the partitioned parameters at stage 3 (in the shards) and,
    with ``exclude_frozen``, less the parameters the engine does not train."""
    partitioned = {id(p) for p in engine.params} if engine.stage3 is not None else set()
    return {
        name: tensor.detach().cpu().clone()
        for name, tensor in engine.module.state_dict(keep_vars=True).items()
        if id(tensor) not in partitioned
        and not (exclude_frozen and isinstance(tensor, nn.Parameter) and not engine.owns(tensor))
    }


def _module_to_load(
    engine: ZeroEngine, state: dict[str, Any], strict: bool
) -> dict[str, torch.Tensor]:
    """The saved weights, completed with the model's own where the checkpoint may lack them
    (frozen parameters it excluded; anything, when not strict) and trimmed to what the model
    has when not strict."""
    saved = dict(state["module"])
    own = engine.module.state_dict()
    frozen = {
        name
        for name, p in engine.module.named_parameters()
        if not engine.owns(p) and name not in saved
    }
    keep = set(own) if not strict else frozen if state.get("frozen_excluded") else set()
    for name in keep - set(saved):
        saved[name] = own[name]
    if not strict:
        saved = {name: tensor for name, tensor in saved.items() if name in own}
    return saved


def _shard_state(engine: ZeroEngine) -> dict[str, Any]:
    state: dict[str, Any] = {
        "optimizer": engine.optimizer.state_dict(),
        "pieces": _pieces(engine),
        "state_index": reshard.state_indices(engine),
    }
    if engine.master.separate:
        state["master"] = engine.master.flat
    if engine.stage3 is not None:
        state["param_shard"] = engine.stage3.shard
    return state


def _pieces(engine: ZeroEngine) -> list[list[int]]:
    """This rank's optimizer tensors: (owned piece, start, stop) each."""
    return [list(piece) for piece in engine.master.pieces]


def _scheduler_state(scheduler: Any) -> dict[str, Any] | None:
    return scheduler.state_dict() if scheduler is not None else None


def _load_module(engine: ZeroEngine, saved: dict[str, torch.Tensor]) -> None:
    missing, unexpected = engine.module.load_state_dict(saved, strict=False)
    names = {id(p): n for n, p in engine.module.named_parameters()}
    partitioned = {names[id(p)] for p in engine.params} if engine.stage3 is not None else set()
    wrong = sorted(set(missing) - partitioned) + sorted(unexpected)
    if wrong:
        raise CheckpointError(f"the checkpoint's weights do not fit this model: {wrong[:5]}")


def _read_checked(
    engine: ZeroEngine, folder: Path
) -> tuple[dict[str, Any], list[dict[str, Any]], bool]:
    """The model states, the shard files this rank needs, and whether the checkpoint has
    this engine's shape (else every saved shard is read, to re-shard)."""
    state = _read(folder / MODEL_STATES, "the model states file")
    _check_compatible(state, engine, folder)
    saved_stage, saved_world = state["shape"]["stage"], state["shape"]["world_size"]
    if state["shape"] == _shape(engine):
        own = _read_shard(folder, engine.communicator.rank if saved_stage > 0 else 0, state)
        if own["pieces"] == _pieces(engine):
            return state, [own], True
        # Otherwise the same layout is split into other sub-groups (sub_group_size).
    ranks = range(saved_world if saved_stage > 0 else 1)
    return state, [_read_shard(folder, r, state) for r in ranks], False


def _read_shard(folder: Path, rank: int, state: dict[str, Any]) -> dict[str, Any]:
    shard = _read(folder / shard_file(rank), f"the shard file of rank {rank}")
    if shard["save_id"] != state["save_id"]:
        raise CheckpointError(
            f"{folder}: files of different saves (a save was interrupted while overwriting "
            "this tag); load another tag"
        )
    return shard


def _check_compatible(state: dict[str, Any], engine: ZeroEngine, folder: Path) -> None:
    """What no re-sharding can bridge: another model, precision or optimizer."""
    if state.get("format") != FORMAT:
        raise CheckpointError(f"{folder}: not a checkpoint of this engine (format)")
    saved, here = state["shape"], _shape(engine)
    for key, what in (("precision", "precision"), ("optimizer", "optimizer")):
        if saved[key] != here[key]:
            raise CheckpointError(
                f"{folder}: saved with {what} {saved[key]}, this run has {here[key]}; "
                "resume with the saved setting"
            )
    numels = {n: c for n, c in zip(saved["param_names"], saved["param_numels"], strict=True)}
    if numels != dict(zip(here["param_names"], here["param_numels"], strict=True)):
        raise CheckpointError(
            f"{folder}: the checkpoint's trained parameters (names and sizes) differ from "
            "this model's"
        )


def _restore_same_shape(
    engine: ZeroEngine, module: dict[str, torch.Tensor], shard: dict[str, Any], optimizer_too: bool
) -> None:
    _load_module(engine, module)
    if engine.stage3 is not None:
        engine.stage3.shard.copy_(shard["param_shard"])
        engine.stage3.invalidate()
    if optimizer_too:
        engine.optimizer.load_state_dict(shard["optimizer"])
    if optimizer_too and engine.master.separate:
        engine.master.flat.copy_(shard["master"])
    else:
        engine.master.reload()


# --- files and ranks ---------------------------------------------------------------------------


def _write(path: Path, obj: Any) -> None:
    with atomic_writer(path) as handle:
        torch.save(obj, handle)


def _read(path: Path, what: str) -> dict[str, Any]:
    if not path.is_file():
        raise CheckpointError(f"{path}: {what} is missing (an incomplete or foreign checkpoint)")
    loaded = torch.load(path, map_location="cpu", weights_only=False)
    if not isinstance(loaded, dict) or "save_id" not in loaded:
        raise CheckpointError(f"{path}: not a checkpoint file of this engine")
    return loaded


def _agree(engine: ZeroEngine, value: str) -> str:
    """Rank 0's ``value`` on every rank."""
    if engine.communicator.group is None:
        return value
    box = [value]
    dist.broadcast_object_list(
        box, dist.get_global_rank(engine.communicator.group, 0), engine.communicator.group
    )
    return str(box[0])


def _barrier(engine: ZeroEngine) -> None:
    if engine.communicator.group is not None:
        dist.barrier(group=engine.communicator.group)
