"""Model info: parameters, activation bytes saved for backward, FLOPs per sample."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from autotune.profiling.flops import flops_per_micro_batch
from autotune.profiling.model_info import (
    ModelInfo,
    model_info,
    model_info_on_meta,
    saved_activation_bytes,
    step_peak_bytes,
)
from autotune.workloads import Workload, resolve_workload

SMALL = {"n_layer": 2, "d_model": 128, "n_head": 4, "seq_len": 64, "vocab": 1024}


@pytest.mark.parametrize(("spec", "args"), [("gpt", SMALL), ("mlp", {})])
def test_activation_bytes_grow_linearly_with_micro_batch(spec: str, args: dict[str, int]) -> None:
    workload = resolve_workload(spec, args)
    generator = torch.Generator().manual_seed(0)
    one, two, four = (
        saved_activation_bytes(workload.model, workload.make_batch(b, generator)) for b in (1, 2, 4)
    )
    assert 0 < one < two < four
    assert four - two == pytest.approx(2 * (two - one), rel=0.01)
    assert model_info(workload).activation_bytes_per_sample == two - one


def test_gpt_activations_include_the_logits() -> None:
    # Cross-entropy keeps its log-softmax: seq_len * vocab floats per sample, at least.
    info = model_info(resolve_workload("gpt", SMALL))
    assert info.activation_bytes_per_sample > SMALL["seq_len"] * SMALL["vocab"] * 4


@pytest.mark.parametrize("on_meta", [False, True])
def test_the_step_peak_grows_linearly_with_micro_batch(on_meta: bool) -> None:
    workload = resolve_workload("gpt", SMALL)
    generator = torch.Generator().manual_seed(0)
    peaks = [
        step_peak_bytes(workload.model, workload.make_batch(b, generator), on_meta=on_meta)
        for b in (2, 4, 8)
    ]
    assert 0 < peaks[0] < peaks[1]
    assert peaks[2] - peaks[1] == pytest.approx(2 * (peaks[1] - peaks[0]), rel=0.01)
    assert all(p.grad is None for p in workload.model.parameters())  # .grad left alone


def test_backward_holds_the_logits_gradient_and_its_inputs_beyond_the_saved_tensors() -> None:
    # At the loss, the logits' gradient and its input's are alive at once on top of every
    # saved tensor: two seq_len * vocab floats a sample (an H100's allocator agreed).
    logits = SMALL["seq_len"] * SMALL["vocab"] * 4
    with torch.device("meta"):
        on_meta = resolve_workload("gpt", SMALL)
    for info in (model_info(resolve_workload("gpt", SMALL)), model_info_on_meta(on_meta)):
        assert info.backward_bytes_per_sample == pytest.approx(2 * logits, rel=0.05)
        assert info.step_bytes_per_sample == (
            info.activation_bytes_per_sample + info.backward_bytes_per_sample
        )


def test_parameters_are_not_counted_as_activations() -> None:
    # Linear saves its input and its weight (as a view); only the input is an activation.
    model = nn.Linear(1000, 1000, bias=False)
    x = torch.randn(1, 1000, requires_grad=True)
    assert saved_activation_bytes(model, (x,)) == 1000 * 4


def test_model_info_of_gpt() -> None:
    workload = resolve_workload("gpt", SMALL)
    info = model_info(workload, micro_batch_size=2)
    num_params = sum(p.numel() for p in workload.model.parameters())
    assert isinstance(info, ModelInfo)
    assert info.num_params == num_params
    assert info.param_bytes == 4 * num_params
    assert info.flops_per_sample == flops_per_micro_batch(workload, 1)


def test_shared_parameters_count_once() -> None:
    lin = nn.Linear(4, 4)
    model = nn.Sequential(lin, lin)

    class Loss(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.net = model

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.net(x).sum()

    workload = Workload(Loss(), lambda b, g: (torch.randn(b, 4, generator=g),))
    assert model_info(workload).num_params == 20


def test_checkpointing_keeps_only_the_blocks_inputs() -> None:
    plain = model_info(resolve_workload("gpt", SMALL))
    checkpointed = model_info(resolve_workload("gpt", {**SMALL, "activation_checkpointing": True}))
    assert checkpointed.num_params == plain.num_params
    assert checkpointed.activation_bytes_per_sample < plain.activation_bytes_per_sample / 2
    # A block keeps its input (seq_len x d_model floats), the head its logits as before.
    kept = SMALL["n_layer"] * SMALL["seq_len"] * SMALL["d_model"] * 4
    assert checkpointed.activation_bytes_per_sample > kept + SMALL["seq_len"] * SMALL["vocab"] * 4


def test_on_meta_attention_is_counted_as_a_gpus_fused_kernel_keeps_it() -> None:
    args = {**SMALL, "seq_len": 1024}
    with torch.device("meta"):
        workload = resolve_workload("gpt", args)
    info = model_info_on_meta(workload, "bf16", workload.activation_checkpointing)
    # The math path would keep each layer's heads x seq x seq scores (fp32): more than all
    # a fused kernel keeps of the whole model.
    scores = args["n_layer"] * args["n_head"] * args["seq_len"] ** 2 * 4
    assert info.activation_bytes_per_sample < scores
    # bf16: two bytes an activation (the logits' cross-entropy keeps a few in fp32).
    fp32 = model_info_on_meta(resolve_on_meta("gpt", args), "fp32")
    assert info.activation_bytes_per_sample < 0.6 * fp32.activation_bytes_per_sample
    # Checkpointed: fewer bytes, the blocks' forward again in FLOPs (attention included).
    assert info.checkpointed_activation_bytes_per_sample is not None
    assert info.checkpointed_activation_bytes_per_sample < info.activation_bytes_per_sample / 2
    assert 0.15 < info.recompute_flops_per_sample / info.flops_per_sample < 0.4
    assert info.flops_per_sample == fp32.flops_per_sample
    assert info.num_param_tensors == len(list(workload.model.parameters()))
    assert len(info.module_param_counts) == 2 + 6 * args["n_layer"] + 2


def resolve_on_meta(spec: str, args: dict[str, int]) -> Workload:
    with torch.device("meta"):
        return resolve_workload(spec, args)


def test_real_model_info_measures_checkpointing_through_the_workloads_switch() -> None:
    workload = resolve_workload("gpt", SMALL)
    info = model_info(workload, 1, workload.activation_checkpointing)
    checkpointed = model_info(resolve_workload("gpt", {**SMALL, "activation_checkpointing": True}))
    assert info.checkpointed_activation_bytes_per_sample == (
        checkpointed.activation_bytes_per_sample
    )
    assert info.recompute_flops_per_sample == pytest.approx(
        checkpointed.flops_per_sample - info.flops_per_sample
    )
    assert not workload.model.cfg.activation_checkpointing  # switched back off
