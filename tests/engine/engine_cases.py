"""Functions the 2-rank pool runs: train with the engine and check against a reference.

Each runs on every rank of the pool's gloo group and returns plain data for the test to check.
"""

from __future__ import annotations

import copy
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from autotune.engine import Lamb, backward_span, initialize, model_state_bytes

VOCAB, WIDTH, SEQ = 32, 16, 6


class TinyNet(nn.Module):
    """Embedding, two linear layers with a LayerNorm, a head; returns the MSE loss."""

    def __init__(self, side: bool = False) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, WIDTH)
        self.fc1 = nn.Linear(WIDTH, 2 * WIDTH)
        self.norm = nn.LayerNorm(2 * WIDTH)
        self.fc2 = nn.Linear(2 * WIDTH, 2 * WIDTH)
        self.head = nn.Linear(2 * WIDTH, 1)
        # A branch only some steps use (``use_side``): its gradients are missing on the others.
        self.side = nn.Linear(2 * WIDTH, 2 * WIDTH) if side else None
        self.use_side = False

    def forward(self, ids: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        hidden = self.embed(ids).mean(dim=1)
        hidden = self.norm(torch.relu(self.fc1(hidden)))
        hidden = torch.tanh(self.fc2(hidden)) + hidden
        if self.side is not None and self.use_side:
            hidden = hidden + self.side(hidden)
        out = self.head(hidden).squeeze(-1).float()
        return ((out - target) ** 2).mean()


# Buckets small enough that TinyNet spreads over several of each kind.
SMALL_BUCKETS = {
    "reduce_bucket_size": 600,
    "allgather_bucket_size": 700,
    "stage3_param_persistence_threshold": 40,
    "stage3_prefetch_bucket_size": 2000,
}


def make_model(seed: int = 0, side: bool = False) -> TinyNet:
    torch.manual_seed(seed)
    return TinyNet(side)


def _side_used(step: int) -> bool:
    return step % 2 == 0


def param_groups(model: TinyNet) -> list[dict[str, Any]]:
    """Groups as training scripts make them: no decay on biases and the norm, a slower
    embedding. Their parameters sit side by side in the engine's flat buffers."""
    plain = [model.embed.weight]
    no_decay = [p for n, p in model.named_parameters() if n.endswith("bias") or "norm" in n]
    chosen = {id(p) for p in [*plain, *no_decay]}
    decay = [p for p in model.parameters() if id(p) not in chosen]
    return [
        {"params": decay, "weight_decay": 0.2},
        {"params": no_decay, "weight_decay": 0.0},
        {"params": plain, "lr": 3e-3},
    ]


def _optimizer_class(name: str) -> type[torch.optim.Optimizer]:
    return Lamb if name == "Lamb" else getattr(torch.optim, name)  # type: ignore[no-any-return]


def global_batch(step: int, size: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(1000 + step)
    return torch.randint(0, VOCAB, (size, SEQ), generator=gen), torch.randn(size, generator=gen)


def base_config(
    zero: dict[str, Any],
    micro: int = 2,
    gas: int = 1,
    clip: float = 0.0,
    precision: str = "fp32",
    optimizer: str = "AdamW",
    lr: float = 1e-2,
    **extra: Any,
) -> dict[str, Any]:
    config: dict[str, Any] = {
        "train_micro_batch_size_per_gpu": micro,
        "gradient_accumulation_steps": gas,
        "gradient_clipping": clip,
        "optimizer": {"type": optimizer, "params": {"lr": lr}},
        "zero_optimization": zero,
        **extra,
    }
    if precision != "fp32":
        config[precision] = {"enabled": True}
    return config


def train(
    config: dict[str, Any],
    steps: int,
    side: bool = False,
    backend_collectives: bool = False,
    groups: bool = False,
    **init: Any,
) -> Any:
    """Train a TinyNet for ``steps`` optimizer steps on this rank's part of each global batch.

    ``side``: the model has a branch used on even steps only. ``backend_collectives``: use
    gloo's own reduce-scatter and all-gather instead of the engine's exchanges (the path every
    other backend takes). ``groups``: train with :func:`param_groups`.
    """
    world, rank = dist.get_world_size(), dist.get_rank()
    model = make_model(side=side)
    if groups:
        init["model_parameters"] = param_groups(model)
    engine, _, _, _ = initialize(model=model, config=config, **init)
    if backend_collectives:
        engine.communicator.exchange = False
    micro, gas = engine.train_micro_batch_size_per_gpu(), engine.gradient_accumulation_steps()
    for step in range(steps):
        engine.module.use_side = _side_used(step)
        ids, target = (t.to(engine.device) for t in global_batch(step, micro * gas * world))
        for m in range(gas):
            start = (m * world + rank) * micro
            loss = engine(ids[start : start + micro], target[start : start + micro])
            engine.backward(loss)
            engine.step()
    return engine


def reference(
    config: dict[str, Any],
    steps: int,
    side: bool = False,
    groups: bool = False,
    device: torch.device | None = None,
) -> dict[str, torch.Tensor]:
    """The same training in one process on the whole global batch, with plain torch (and
    the engine's Lamb, unsharded, whose formula the unit tests check), on ``device`` (the
    CPU by default); the weights come back on the CPU."""
    world = dist.get_world_size()
    device = device or torch.device("cpu")
    model = make_model(side=side).to(device)
    opt_cfg = config["optimizer"]
    params = param_groups(model) if groups else model.parameters()
    optimizer = _optimizer_class(opt_cfg["type"])(params, **opt_cfg["params"])
    size = config["train_micro_batch_size_per_gpu"] * config["gradient_accumulation_steps"] * world
    for step in range(steps):
        model.use_side = _side_used(step)
        loss = model(*(t.to(device) for t in global_batch(step, size)))
        loss.backward()
        if config["gradient_clipping"]:
            torch.nn.utils.clip_grad_norm_(model.parameters(), config["gradient_clipping"])
        optimizer.step()
        optimizer.zero_grad()
    return {k: v.detach().cpu() for k, v in model.state_dict().items()}


def match_reference(
    config: dict[str, Any],
    steps: int = 3,
    atol: float = 1e-5,
    rtol: float = 1.3e-6,
    side: bool = False,
    backend_collectives: bool = False,
    groups: bool = False,
) -> float:
    engine = train(config, steps, side=side, backend_collectives=backend_collectives, groups=groups)
    ours = engine.module_state_dict()
    expected = reference(config, steps, side=side, groups=groups, device=engine.device)
    for name, value in expected.items():
        torch.testing.assert_close(ours[name].float(), value, atol=atol, rtol=rtol, msg=name)
    return max(float((ours[k].float() - v).abs().max()) for k, v in expected.items())


def collectives(config: dict[str, Any], steps: int = 2) -> dict[str, Any]:
    """Collective calls (total and during backward) of a short run, and its memory."""
    engine = train(config, steps)
    log = engine.communicator.log
    extra = {}
    if engine.stage3 is not None:
        extra = {
            "prefetched": engine.stage3.prefetched,
            "peak_live": engine.stage3.peak_live_numel,
            "peak_ahead": engine.stage3.peak_ahead_numel,
        }
    return {
        "calls": dict(log.calls),
        "in_backward": dict(log.calls_in_backward),
        "peak": engine.peak_memory_bytes(),
        "optimizer_tensors": len(engine.master.params),
        "overlapped": engine.grads.overlapped,
        **extra,
    }


def collectives_by_engine_span(config: dict[str, Any]) -> dict[str, Any]:
    """:func:`collectives` where torch lacks its private graph-task query (the fallback)."""
    saved = backward_span._graph_task_id
    backward_span._graph_task_id = None
    try:
        return collectives(config)
    finally:
        backward_span._graph_task_id = saved


def model_states(stage: int) -> dict[str, int]:
    """Model-state bytes this rank holds after a step, and what the ZeRO formula says."""
    config = base_config(
        {"stage": stage, "stage3_param_persistence_threshold": 0}, optimizer="Adam"
    )
    engine = train(config, steps=1)
    held = engine.memory_breakdown()
    num_params = sum(p.numel() for p in make_model().parameters())
    formula = model_state_bytes(num_params, stage, dist.get_world_size())
    return {
        "params": held["params"],
        "grads": held["grads"],
        "optimizer_state": held["optimizer_state"],
        "master": held.get("master", 0),
        "formula_params": formula.params,
        "formula_grads": formula.grads,
        "formula_optimizer_state": formula.optimizer_state,
        "formula_total": formula.total,
        "padding_elements": len(engine.layout.segments) * dist.get_world_size(),
    }


def oom_on_one_rank(stage: int) -> str:
    """Only rank 1 gets a budget it exceeds; both ranks must raise, and the group still works."""
    budget = 10**9 if dist.get_rank() == 0 else 20_000
    try:
        train(base_config({"stage": stage}), steps=2, device_memory_bytes=budget)
        outcome = "trained"
    except torch.OutOfMemoryError:
        outcome = "oom"
    probe = torch.ones(1)
    dist.all_reduce(probe)  # hangs (and the pool times out) if a rank were left behind
    return f"{outcome}:{int(probe.item())}"


def fp16_overflow() -> dict[str, Any]:
    """A huge initial scale overflows fp16: steps are skipped and the scale comes down."""
    config = base_config(
        {"stage": 2},
        precision="fp16",
        fp16={"enabled": True, "initial_scale_power": 32, "hysteresis": 1},
    )
    engine = train(config, steps=1)
    before = {k: v.clone() for k, v in engine.module_state_dict().items()}
    scale_before = engine.loss_scale
    ids, target = (t.to(engine.device) for t in global_batch(0, 2))
    engine.backward(engine(ids, target))
    engine.step()
    after = engine.module_state_dict()
    skipped_changed = any(not torch.equal(before[k], after[k]) for k in before)
    for _ in range(20):
        engine.backward(engine(ids, target))
        engine.step()
    return {
        "skipped": engine.skipped_steps,
        "scale_before": scale_before,
        "scale_after": engine.loss_scale,
        "global_steps": engine.global_steps,
        "changed_on_skip": skipped_changed,
        "finite": all(bool(torch.isfinite(v).all()) for v in after.values()),
    }


def save_and_load(path: str) -> float:
    """Stage 3 saves a consolidated state dict; a stage-0 engine loads it unchanged."""
    engine = train(base_config({"stage": 3, "stage3_param_persistence_threshold": 0}), steps=2)
    engine.save_model_state_dict(path)
    saved = engine.module_state_dict()
    other, _, _, _ = initialize(model=make_model(seed=5), config=base_config({"stage": 2}))
    other.load_model_state_dict(path)
    loaded = other.module_state_dict()
    target = copy.deepcopy(saved)
    return max(float((loaded[k] - target[k]).abs().max()) for k in target)


def start_from_rank0(buffer_dtypes: list[str]) -> dict[str, Any]:
    """Build an engine on a TinyNet with one rank-dependent buffer per dtype, in that order.

    Returns the dtypes the start-up broadcasts went in (every rank must post them in one
    order, whatever the process) and the buffers after it (rank 0's on every rank).
    """
    rank = dist.get_rank()
    model = make_model()
    for index, name in enumerate(buffer_dtypes):
        values = torch.arange(4) + 10 * rank + index
        model.register_buffer(f"extra_{index}", values.to(getattr(torch, name)))
    broadcast_dtypes: list[str] = []
    original = dist.broadcast

    def recording(tensor: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        broadcast_dtypes.append(str(tensor.dtype).removeprefix("torch."))
        return original(tensor, *args, **kwargs)

    dist.broadcast = recording
    try:
        engine, _, _, _ = initialize(model=model, config=base_config({"stage": 2}))
    finally:
        dist.broadcast = original
    ids, target = global_batch(0, 4)
    engine.backward(engine(ids[2 * rank : 2 * rank + 2], target[2 * rank : 2 * rank + 2]))
    engine.step()
    buffers = {name: buf.tolist() for name, buf in engine.module.named_buffers()}
    return {"dtypes": broadcast_dtypes, "buffers": buffers}


def checkpointed_gpt_matches(stage: int, steps: int = 2) -> float:
    """A small GPT trained by the engine with activation checkpointing ends with the weights
    it has without: the recompute in backward (which re-runs the blocks' forward hooks, and at
    stage 3 gathers their parameters again) changes nothing but memory. Returns the largest
    difference."""
    from autotune.workloads import build_gpt

    world, rank = dist.get_world_size(), dist.get_rank()
    config = base_config({"stage": stage, **SMALL_BUCKETS}, micro=2, lr=1e-3)
    states = []
    for checkpointing in (False, True):
        torch.manual_seed(0)
        workload = build_gpt(
            n_layer=2, d_model=32, n_head=2, seq_len=8, vocab=64,
            activation_checkpointing=checkpointing,
        )  # fmt: skip
        engine, _, _, _ = initialize(model=workload.model, config=config)
        for step in range(steps):
            generator = torch.Generator().manual_seed(step * world + rank)
            loss = engine(*workload.make_batch(2, generator))
            engine.backward(loss)
            engine.step()
        states.append(engine.module_state_dict())
    plain, checkpointed = states
    for name, value in plain.items():
        torch.testing.assert_close(checkpointed[name], value, atol=1e-6, rtol=1e-5, msg=name)
    return max(float((checkpointed[k] - v).abs().max()) for k, v in plain.items())
