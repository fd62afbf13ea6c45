"""Functions the 2-rank pool runs for the script-facing API: checkpoints resume exactly,
GatheredParameters keeps an edit, a client optimizer trains like the config's."""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from autotune.engine import initialize
from autotune.engine.checkpoint import CheckpointError, shard_file
from tests.engine.engine_cases import base_config, global_batch, make_model, param_groups, reference


def resume_config(stage: int, precision: str) -> dict[str, Any]:
    config: dict[str, Any] = {
        "train_micro_batch_size_per_gpu": 2,
        "gradient_accumulation_steps": 2,
        "gradient_clipping": 0.5,
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-2}},
        "scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": 4}},
        "zero_optimization": {
            "stage": stage,
            "reduce_bucket_size": 600,
            "stage3_param_persistence_threshold": 40,
        },
    }
    if precision != "fp32":
        config[precision] = {"enabled": True}
    if precision == "fp16":
        config["fp16"]["initial_scale_power"] = 8
    return config


def _steps(engine: Any, start: int, stop: int) -> list[float]:
    world, rank = engine.world_size, engine.global_rank
    micro, gas = engine.train_micro_batch_size_per_gpu(), engine.gradient_accumulation_steps()
    losses = []
    for step in range(start, stop):
        ids, target = global_batch(step, micro * gas * world)
        for m in range(gas):
            begin = (m * world + rank) * micro
            loss = engine(ids[begin : begin + micro], target[begin : begin + micro])
            engine.backward(loss)
            engine.step()
            losses.append(loss.item())
    return losses


def resume_matches(config: dict[str, Any], save_dir: str, split: int, total: int) -> str:
    """Losses and weights of save-at-``split``-then-resume equal a run never stopped."""
    reference, *_ = initialize(model=make_model(), config=config)
    expected = _steps(reference, 0, total)
    first, *_ = initialize(model=make_model(), config=config)
    before = _steps(first, 0, split)
    first.save_checkpoint(save_dir, client_state={"step": split})
    # A fresh engine on other weights: everything must come from the checkpoint.
    resumed, *_ = initialize(model=make_model(seed=7), config=config)
    path, client = resumed.load_checkpoint(save_dir)
    assert client == {"step": split} and path is not None and path.endswith(f"step{split}")
    assert resumed.global_steps == split and resumed.get_lr() == first.get_lr()
    after = _steps(resumed, split, total)
    assert before + after == expected, (before + after, expected)
    ours, theirs = resumed.module_state_dict(), reference.module_state_dict()
    assert all(torch.equal(ours[k], theirs[k]) for k in theirs)
    assert resumed.loss_scale == reference.loss_scale
    return f"{expected[-1]:.6f}"


def reshards(save_dir: str, saved_stage: int, precision: str) -> list[float]:
    """A 2-rank checkpoint loaded at every other stage, and by one rank alone (a world of
    one with twice the accumulation: the same global batch), continues like the original."""
    config = resume_config(saved_stage, precision)
    engine, *_ = initialize(model=make_model(), config=config)
    _steps(engine, 0, 2)
    engine.save_checkpoint(save_dir, tag="saved")
    saved_lr = engine.get_lr()
    _steps(engine, 2, 4)
    expected = engine.module_state_dict()
    alone = [dist.new_group([0]), dist.new_group([1])][dist.get_rank()]
    errors = []
    variants: list[tuple[dict[str, Any], dict[str, Any]]] = [
        (resume_config(stage, precision), {}) for stage in range(4) if stage != saved_stage
    ]
    single = resume_config((saved_stage + 1) % 4, precision)
    single["gradient_accumulation_steps"] = 4
    variants.append((single, {"process_group": alone}))
    for variant, extra in variants:
        other, *_ = initialize(model=make_model(seed=3), config=variant, **extra)
        other.load_checkpoint(save_dir, tag="saved")
        assert other.global_steps == 2 and other.get_lr() == saved_lr
        _steps(other, 2, 4)
        ours = other.module_state_dict()
        errors.append(max(float((ours[k] - v).float().abs().max()) for k, v in expected.items()))
    return errors


def refuses_other_shapes(save_dir: str) -> list[str]:
    """Another precision or optimizer, and a torn save, are refused on every rank."""
    config = resume_config(2, "fp32")
    engine, *_ = initialize(model=make_model(), config=config)
    _steps(engine, 0, 1)
    engine.save_checkpoint(save_dir, tag="s2")
    errors = []
    other_optimizer = resume_config(2, "fp32")
    other_optimizer["optimizer"] = {"type": "SGD", "params": {"lr": 0.1}}
    for variant in (resume_config(2, "bf16"), other_optimizer):
        other, *_ = initialize(model=make_model(), config=variant)
        try:
            other.load_checkpoint(save_dir, tag="s2")
            errors.append("loaded")
        except CheckpointError as err:
            errors.append(str(err))
    # An interrupted overwrite: rank 1's shard is from another save.
    if dist.get_rank() == 1:
        path = f"{save_dir}/s2/{shard_file(1)}"
        shard = torch.load(path, weights_only=False)
        torch.save({**shard, "save_id": "another"}, path)
    dist.barrier()
    try:
        engine.load_checkpoint(save_dir, tag="s2")
        errors.append("loaded")
    except CheckpointError as err:
        errors.append(str(err))
    return errors


def gathered_parameters_modify(stage: int) -> list[float]:
    """Rank 1 edits a weight inside GatheredParameters; every rank trains from the edit."""
    import autotune as deepspeed

    config = resume_config(stage, "bf16")
    engine, *_ = initialize(model=make_model(), config=config)
    weight = engine.module.fc1.weight
    with deepspeed.zero.GatheredParameters([weight], modifier_rank=1):
        assert weight.shape == (32, 16)
        if dist.get_rank() == 1:
            with torch.no_grad():
                weight.fill_(0.5)
    _steps(engine, 0, 1)
    full = engine.module_state_dict()["fc1.weight"].float()
    master = engine.master.flat if engine.master.separate else None
    assert master is not None
    return [float(full.mean()), float((full - 0.5).abs().max())]


def client_optimizer_matches(stage: int) -> float:
    """A client AdamW instance with param groups, rebuilt over the shards, trains like torch."""
    config = base_config({"stage": stage, "reduce_bucket_size": 600}, optimizer="AdamW")
    model = make_model()
    client = torch.optim.AdamW(param_groups(model), lr=1e-2)
    del config["optimizer"]
    engine, optimizer, *_ = initialize(model=model, optimizer=client, config=config)
    assert isinstance(optimizer, torch.optim.AdamW) and len(optimizer.param_groups) == 3
    _steps(engine, 0, 3)
    expected = reference(base_config({"stage": 0}), 3, groups=True)
    ours = engine.module_state_dict()
    for name, value in expected.items():
        torch.testing.assert_close(ours[name], value, atol=1e-5, rtol=1.3e-6, msg=name)
    return max(float((ours[k] - v).abs().max()) for k, v in expected.items())


def zero3_local_pieces(persistence_threshold: int) -> dict[str, Any]:
    """Each parameter's ``ds_tensor`` on this rank, its ``ds_*`` sizes, and its whole value."""
    config = resume_config(3, "fp32")
    config["zero_optimization"]["stage3_param_persistence_threshold"] = persistence_threshold
    engine, *_ = initialize(model=make_model(), config=config)
    whole = engine.module_state_dict()
    return {
        name: (
            param.ds_tensor.tolist(),
            param.partition_numel(),
            param.ds_numel,
            tuple(param.ds_shape),
            whole[name].flatten().tolist(),
        )
        for name, param in engine.module.named_parameters()
    }
