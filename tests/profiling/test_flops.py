"""FLOPs of a training micro-step, counted on meta and on CPU."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from autotune.profiling.flops import count_train_flops, flops_per_micro_batch
from autotune.workloads import Workload, resolve_workload

SMALL = {"n_layer": 2, "d_model": 128, "n_head": 4, "seq_len": 64, "vocab": 1024}


@pytest.fixture(scope="module")
def gpt() -> Workload:
    return resolve_workload("gpt", SMALL)


def _non_embedding_params(workload: Workload) -> int:
    model = workload.model
    embeddings = model.wte.weight.numel() + model.wpe.weight.numel()  # type: ignore[union-attr]
    return sum(p.numel() for p in model.parameters()) - embeddings


def test_gpt_flops_are_6_x_non_embedding_params_x_tokens(gpt: Workload) -> None:
    # The usual convention (Kaplan et al.): embedding lookups are not matmuls, the untied LM
    # head is; attention's own matmuls add 12 * n_layer * seq_len * d_model per token.
    tokens = 4 * SMALL["seq_len"]
    flops = flops_per_micro_batch(gpt, 4)
    assert flops == pytest.approx(6 * _non_embedding_params(gpt) * tokens, rel=0.10)
    attention = 12 * SMALL["n_layer"] * SMALL["seq_len"] * SMALL["d_model"] * tokens
    assert flops == pytest.approx(6 * _non_embedding_params(gpt) * tokens + attention, rel=0.01)


def test_default_gpt_flops_within_10_percent_of_6nt() -> None:
    workload = resolve_workload("gpt")
    flops = flops_per_micro_batch(workload, 2)
    assert flops == pytest.approx(6 * _non_embedding_params(workload) * 2 * 128, rel=0.10)


def test_flops_are_linear_in_micro_batch(gpt: Workload) -> None:
    assert flops_per_micro_batch(gpt, 4) == 4 * flops_per_micro_batch(gpt, 1)


def test_meta_counts_attention_that_cpu_misses(gpt: Workload) -> None:
    meta = flops_per_micro_batch(gpt, 2)
    cpu = flops_per_micro_batch(gpt, 2, on_meta=False)
    attention = 12 * SMALL["n_layer"] * SMALL["seq_len"] ** 2 * SMALL["d_model"] * 2
    assert meta > cpu
    assert meta - cpu == pytest.approx(attention, rel=0.01)


def test_counting_leaves_the_model_untouched(gpt: Workload) -> None:
    before = {k: v.clone() for k, v in gpt.model.state_dict().items()}
    flops_per_micro_batch(gpt, 1)
    flops_per_micro_batch(gpt, 1, on_meta=False)
    assert all(p.grad is None for p in gpt.model.parameters())
    assert all(torch.equal(v, before[k]) for k, v in gpt.model.state_dict().items())


def test_linear_model_flops_exact() -> None:
    # forward 2*B*in*out, backward twice that (grad of weight; no grad for the input).
    model = nn.Sequential(nn.Linear(8, 4, bias=False))
    x = torch.randn(3, 8)

    class Loss(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner = model

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.inner(x).sum()

    assert count_train_flops(Loss(), (x,)) == 2 * 3 * 8 * 4 * 2


def test_falls_back_to_device_when_meta_fails(caplog: pytest.LogCaptureFixture) -> None:
    class DataDependent(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(8, 4, bias=False)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.lin(x).sum() / x.abs().max().item()  # .item() cannot run on meta

    workload = Workload(DataDependent(), lambda b, g: (torch.randn(b, 8, generator=g),))
    assert flops_per_micro_batch(workload, 3) == 2 * 3 * 8 * 4 * 2
    assert "counting FLOPs on meta failed" in caplog.text


def test_checkpointing_counts_the_recompute_on_meta(
    gpt: Workload, caplog: pytest.LogCaptureFixture
) -> None:
    plain = flops_per_micro_batch(gpt, 4)
    checkpointed = resolve_workload("gpt", {**SMALL, "activation_checkpointing": True})
    recompute = flops_per_micro_batch(checkpointed, 4) - plain
    assert "meta failed" not in caplog.text  # counted on meta, not by a real step
    # Backward re-runs each block's forward, but stops once it has what backward needs: the
    # MLP's output projection (d_model x 4 d_model) is the block's last op and not re-run.
    tokens = 4 * SMALL["seq_len"]
    head = 6 * SMALL["d_model"] * SMALL["vocab"] * tokens
    blocks_forward = (plain - head) / 3
    last_projection = SMALL["n_layer"] * 2 * 4 * SMALL["d_model"] ** 2 * tokens
    assert recompute == pytest.approx(blocks_forward - last_projection, rel=0.02)
