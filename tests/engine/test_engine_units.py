"""Engine parts that need no process group: layout math, loss scaling, schedules, Lamb, config."""

from __future__ import annotations

import math
import re
from typing import Any

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from autotune.config import ConfigError, load_config
from autotune.engine import (
    DynamicLossScaler,
    Lamb,
    LRRangeTest,
    OneCycle,
    WarmupDecayLR,
    WarmupLR,
    backward_span,
    build_loss_scaler,
    initialize,
    model_state_bytes,
)
from autotune.engine.partition import FlatLayout, group_by_numel


@given(
    st.lists(st.integers(1, 50), min_size=1, max_size=12),
    st.integers(1, 4),
    st.integers(1, 120),
    st.integers(1, 200),
)
def test_layout_covers_every_element_once(
    numels: list[int], world: int, bucket: int, gather: int
) -> None:
    layout = FlatLayout.build(numels, group_by_numel(numels, bucket), world)
    assert layout.numel % world == 0 and layout.shard_numel * world == layout.numel
    ends = [o + n for o, n in zip(layout.param_offsets, layout.param_numels, strict=True)]
    assert all(e <= o for e, o in zip(ends, layout.param_offsets[1:], strict=False))
    for segment in layout.segments:
        assert segment.numel == segment.chunk * world
    columns = [
        (s, c) for rnd in layout.gather_chunks(gather) for s, a, b in rnd for c in range(a, b)
    ]
    assert sorted(columns) == [
        (i, c) for i, s in enumerate(layout.segments) for c in range(s.chunk)
    ]
    assert all(
        sum(b - a for _, a, b in rnd) * world <= max(gather, world)
        for rnd in layout.gather_chunks(gather)
    )


def test_group_by_numel_keeps_oversized_items_alone() -> None:
    assert group_by_numel([5, 5, 20, 1, 1], 10) == [2, 1, 2]


def test_dynamic_scaler_overflow_then_clean_window() -> None:
    scaler = DynamicLossScaler(
        2.0**16, scale_window=3, hysteresis=2, consecutive_hysteresis=False, min_scale=1.0
    )
    scaler.update(overflow=True)  # uses up hysteresis, no change yet
    assert scaler.scale == 2.0**16
    scaler.update(overflow=True)
    assert scaler.scale == 2.0**15
    for _ in range(3):
        scaler.update(overflow=False)
    assert scaler.scale == 2.0**16


def test_dynamic_scaler_respects_min_and_consecutive_hysteresis() -> None:
    scaler = DynamicLossScaler(
        4.0, scale_window=100, hysteresis=2, consecutive_hysteresis=True, min_scale=2.0
    )
    scaler.update(True)
    scaler.update(False)  # restores hysteresis: the next lone overflow is tolerated
    scaler.update(True)
    assert scaler.scale == 4.0
    for _ in range(5):
        scaler.update(True)
    assert scaler.scale == 2.0


def test_static_and_disabled_scalers() -> None:
    static = build_loss_scaler(load_config({"fp16": {"enabled": True, "loss_scale": 128}}).fp16)
    static.update(True)
    assert static.scale == 128 and not static.dynamic
    assert build_loss_scaler(load_config({}).fp16).scale == 1.0
    dynamic = build_loss_scaler(
        load_config({"fp16": {"enabled": True, "initial_scale_power": 8}}).fp16
    )
    assert dynamic.dynamic and dynamic.scale == 256


def _lrs(scheduler: torch.optim.lr_scheduler.LRScheduler, steps: int) -> list[float]:
    lrs = []
    for _ in range(steps):
        lrs.append(scheduler.optimizer.param_groups[0]["lr"])
        scheduler.optimizer.step()
        scheduler.step()
    return lrs


def _opt() -> torch.optim.Optimizer:
    return torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0, momentum=0.9)


def test_warmup_schedules_follow_deepspeed() -> None:
    lrs = _lrs(WarmupLR(_opt(), 0.0, 1.0, warmup_num_steps=4, warmup_type="linear"), 7)
    assert lrs == pytest.approx([0.0, 0.0, 0.25, 0.5, 0.75, 1.0, 1.0])
    log = _lrs(WarmupLR(_opt(), 0.0, 1.0, warmup_num_steps=4), 4)
    assert log[2] == pytest.approx(math.log(2) / math.log(4))
    decay = _lrs(
        WarmupDecayLR(
            _opt(),
            total_num_steps=6,
            warmup_min_lr=0.0,
            warmup_max_lr=1.0,
            warmup_num_steps=2,
            warmup_type="linear",
        ),
        9,
    )
    assert decay == pytest.approx([0.0, 0.0, 0.5, 1.0, 0.75, 0.5, 0.25, 0.0, 0.0])


def test_one_cycle_and_range_test() -> None:
    cycle = OneCycle(
        _opt(),
        cycle_min_lr=0.1,
        cycle_max_lr=1.0,
        cycle_first_step_size=2,
        cycle_min_mom=0.8,
        cycle_max_mom=0.9,
    )
    lrs = _lrs(cycle, 2)
    assert cycle.optimizer.param_groups[0]["momentum"] == pytest.approx(0.8)  # at the peak lr
    lrs += _lrs(cycle, 4)
    assert lrs == pytest.approx([0.1, 0.55, 1.0, 0.55, 0.1, 0.1])
    assert _lrs(LRRangeTest(_opt(), 0.1, lr_range_test_step_size=2), 3) == pytest.approx(
        [0.1, 0.15, 0.2]
    )


def test_lamb_matches_its_formula() -> None:
    weight = torch.nn.Parameter(torch.tensor([3.0, 4.0]))
    optimizer = Lamb([weight], lr=0.1, weight_decay=0.0)
    weight.grad = torch.tensor([1.0, -1.0])
    optimizer.step()
    update = torch.tensor([1.0, -1.0]) / (1 + 1e-8)  # m̂ / (sqrt(v̂) + eps) after one step
    trust = 5.0 / float(update.norm())
    torch.testing.assert_close(weight.detach(), torch.tensor([3.0, 4.0]) - 0.1 * trust * update)


def test_model_state_formulas() -> None:
    psi, n = 1200, 4
    assert model_state_bytes(psi, 0, n).total == 16 * psi
    assert model_state_bytes(psi, 1, n).total == 8 * psi + 8 * psi // n
    assert model_state_bytes(psi, 2, n).total == 4 * psi + 12 * psi // n
    assert model_state_bytes(psi, 3, n).total == 16 * psi // n
    assert model_state_bytes(psi, 0, n, precision="bf16").total == 16 * psi
    assert model_state_bytes(psi, 2, n, precision="bf16").total == 2 * psi + 14 * psi // n


def _model() -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 1))


@pytest.mark.parametrize(
    ("zero", "key"),
    [
        (
            {"stage": 3, "offload_optimizer": {"device": "nvme", "nvme_path": "/x"}},
            "zero_optimization.offload_optimizer.device",
        ),
        (
            {"stage": 3, "offload_param": {"device": "cpu"}},
            "zero_optimization.offload_param.device",
        ),
        ({"stage": 3, "zero_quantized_weights": True}, "zero_optimization.zero_quantized_weights"),
        ({"stage": 3, "zero_hpz_partition_size": 2}, "zero_optimization.zero_hpz_partition_size"),
        ({"stage": [1, 2]}, "zero_optimization.stage"),
    ],
)
def test_unsupported_settings_name_their_key(zero: dict[str, object], key: str) -> None:
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")) as err:
        initialize(
            model=_model(), config={"train_micro_batch_size_per_gpu": 1, "zero_optimization": zero}
        )
    assert "not supported" in str(err.value) or "search" in str(err.value)


@pytest.mark.parametrize("key", ["fp16.enabled", "bf16.enabled", "gradient_clipping"])
def test_an_auto_left_for_training_names_its_key(key: str) -> None:
    from autotune.config import set_key
    from autotune.engine.settings import check_supported

    spec: dict[str, object] = {"train_micro_batch_size_per_gpu": 1}
    set_key(spec, key, "auto")
    with pytest.raises(ConfigError, match=rf"^{re.escape(key)}: \"auto\" must be resolved"):
        check_supported(load_config(spec))


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_world_of_one_trains_without_a_launcher(stage: int) -> None:
    torch.manual_seed(0)
    model = _model()
    engine, _, _, scheduler = initialize(
        model=model,
        config={
            "train_batch_size": 4,
            "gradient_accumulation_steps": 2,
            "optimizer": {"type": "Lamb", "params": {"lr": 0.01}},
            "scheduler": {
                "type": "WarmupLR",
                "params": {"warmup_min_lr": 0.01, "warmup_num_steps": 10},
            },
            "zero_optimization": {"stage": stage},
        },
    )
    assert engine.communicator.group is None and engine.train_micro_batch_size_per_gpu() == 2
    before = engine.module_state_dict()
    for _ in range(4):
        engine.backward(engine(torch.randn(2, 4)).pow(2).mean())
        engine.step()
    assert engine.global_steps == 2 and scheduler is not None
    after = engine.module_state_dict()
    assert any(not torch.equal(before[k], after[k]) for k in before)
    assert sum(engine.communicator.log.calls.values()) == 0
    assert engine.peak_memory_bytes() > 0


def test_cpu_budget_raises_out_of_memory() -> None:
    engine, _, _, _ = initialize(
        model=_model(), config={"train_micro_batch_size_per_gpu": 64, "device_memory_bytes": 2000}
    )
    with pytest.raises(torch.OutOfMemoryError):
        engine(torch.randn(64, 4))


@pytest.mark.parametrize("stage", [0, 1, 2])
def test_a_forward_over_the_budget_stops_where_it_goes_over(stage: int) -> None:
    # Eight layers, each saving its 64 x 64 float input (16 KiB): a budget of about three.
    layers = [torch.nn.Linear(64, 64, bias=False) for _ in range(8)]
    ran: list[int] = []
    for index, layer in enumerate(layers):
        layer.register_forward_pre_hook(lambda module, args, index=index: ran.append(index))
    config: dict[str, Any] = {
        "train_micro_batch_size_per_gpu": 64,
        "zero_optimization": {"stage": stage},
    }
    model = torch.nn.Sequential(*layers)
    held = sum(initialize(model=model, config=config)[0].memory_breakdown().values())
    config["device_memory_bytes"] = held + 3 * 64 * 64 * 4
    engine, _, _, _ = initialize(model=model, config=config)
    with pytest.raises(torch.OutOfMemoryError, match="in forward"):
        engine(torch.randn(64, 64))
    # As a GPU's allocator: not a whole forward first, holding every activation.
    assert 0 < len(ran) < len(layers), ran


def test_activations_are_counted_and_released() -> None:
    engine, _, _, _ = initialize(model=_model(), config={"train_micro_batch_size_per_gpu": 64})
    loss = engine(torch.randn(64, 4)).pow(2).mean()
    assert engine.memory_breakdown()["activations"] >= 64 * 4 * 4
    engine.backward(loss)
    assert engine.memory_breakdown()["activations"] == 0


def test_param_groups_become_optimizer_groups() -> None:
    model = _model()
    weights = [p for n, p in model.named_parameters() if n.endswith("weight")]
    biases = [p for n, p in model.named_parameters() if n.endswith("bias")]
    _, optimizer, _, _ = initialize(
        model=model,
        model_parameters=[{"params": weights, "lr": 0.5}, {"params": biases, "weight_decay": 0.0}],
        config={"train_micro_batch_size_per_gpu": 2, "zero_optimization": {"stage": 2}},
    )
    assert [g["lr"] for g in optimizer.param_groups] == [0.5, 1e-3]
    assert optimizer.param_groups[1]["weight_decay"] == 0.0
    held = [sum(p.numel() for p in g["params"]) for g in optimizer.param_groups]
    assert held == [sum(p.numel() for p in weights), sum(p.numel() for p in biases)]


@pytest.mark.parametrize(
    ("groups", "message"),
    [
        (lambda m: [{"lr": 0.1}], "has no 'params'"),
        (lambda m: [{"params": list(m.parameters())}, *m.parameters()], "more than one"),
        (lambda m: [torch.nn.Parameter(torch.zeros(2))], "not a parameter of the model"),
    ],
)
def test_bad_param_groups_name_the_problem(groups: Any, message: str) -> None:
    model = _model()
    with pytest.raises(ValueError, match=message):
        initialize(model=model, model_parameters=groups(model), config={"train_batch_size": 2})


@pytest.mark.parametrize("private_api", [True, False], ids=["graph_task_id", "engine_span"])
def test_in_backward_answers_with_or_without_torch_private_query(
    private_api: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    if not private_api:
        monkeypatch.setattr(backward_span, "_graph_task_id", None)
    seen: list[bool] = []
    weight = torch.nn.Parameter(torch.ones(3))
    weight.register_post_accumulate_grad_hook(lambda _: seen.append(backward_span.in_backward()))
    with backward_span.engine_backward():
        (weight * 2).sum().backward()
    assert seen == [True] and not backward_span.in_backward()


def test_a_missing_or_changed_graph_task_query_falls_back(monkeypatch: pytest.MonkeyPatch) -> None:
    assert backward_span.probe_graph_task_id() is not None  # this torch has it
    monkeypatch.delattr(torch._C, "_current_graph_task_id")
    assert backward_span.probe_graph_task_id() is None
    monkeypatch.setattr(torch._C, "_current_graph_task_id", lambda task: task, raising=False)
    assert backward_span.probe_graph_task_id() is None  # wrong signature
