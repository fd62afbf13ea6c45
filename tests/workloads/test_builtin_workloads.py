"""The built-in workloads: gpt, mlp, hf_gpt2."""

from __future__ import annotations

import math
import sys
from dataclasses import replace

import pytest
import torch

from autotune.workloads import (
    GPT_SIZES,
    WorkloadError,
    check_workload,
    resolve_workload,
)

TINY_GPT = {"n_layer": 1, "d_model": 64, "n_head": 2, "seq_len": 16, "vocab": 128}


def _loss_and_grads(spec: str, args: dict[str, object], micro_batch_size: int = 3) -> float:
    workload = resolve_workload(spec, args)
    inputs = workload.make_batch(micro_batch_size, torch.Generator().manual_seed(0))
    loss = workload.model(*inputs)
    assert loss.dim() == 0
    loss.backward()
    for name, param in workload.model.named_parameters():
        assert param.grad is not None, name
        assert torch.isfinite(param.grad).all(), name
    return loss.item()


@pytest.mark.parametrize(
    ("spec", "args"),
    [("gpt", {}), ("gpt", TINY_GPT), ("mlp", {}), ("mlp", {"n_layer": 0, "d_out": 3})],
)
def test_builtin_gives_finite_scalar_loss_and_gradients(spec: str, args: dict[str, object]) -> None:
    assert math.isfinite(_loss_and_grads(spec, args))


def test_gpt_loss_starts_near_uniform() -> None:
    # Small init + random tokens: the model predicts roughly uniformly over the vocabulary.
    assert _loss_and_grads("gpt", TINY_GPT) == pytest.approx(math.log(128), rel=0.05)


def test_gpt_batch_shapes_and_next_token_targets() -> None:
    workload = resolve_workload("gpt", TINY_GPT)
    idx, targets = workload.make_batch(5, torch.Generator().manual_seed(1))
    assert idx.shape == targets.shape == (5, 16)
    assert idx.dtype == torch.int64
    assert torch.equal(idx[:, 1:], targets[:, :-1])
    assert int(idx.max()) < 128


@pytest.mark.parametrize("spec", ["gpt", "mlp"])
def test_same_seed_same_weights_and_batches(spec: str) -> None:
    first, second = resolve_workload(spec, seed=7), resolve_workload(spec, seed=7)
    for (name, a), (_, b) in zip(
        first.model.state_dict().items(), second.model.state_dict().items(), strict=True
    ):
        assert torch.equal(a, b), name
    batch_a = first.make_batch(2, torch.Generator().manual_seed(3))
    batch_b = second.make_batch(2, torch.Generator().manual_seed(3))
    assert all(torch.equal(a, b) for a, b in zip(batch_a, batch_b, strict=True))


def test_different_seed_different_weights() -> None:
    a = resolve_workload("mlp", seed=0).model.state_dict()
    b = resolve_workload("mlp", seed=1).model.state_dict()
    assert not all(torch.equal(a[k], b[k]) for k in a)


def test_building_leaves_the_global_rng_alone() -> None:
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    resolve_workload("mlp", seed=5)
    assert torch.equal(torch.rand(3), expected)


def test_27m_size_has_27_3m_parameters() -> None:
    # 6 blocks x (12 d^2 + 4 d) + final LN 2d + wte, wpe and an untied head.
    d, vocab, seq = 512, 8192, 128
    expected = 6 * (12 * d * d + 4 * d) + 2 * d + 2 * vocab * d + seq * d
    assert expected == 27_341_824
    assert check_workload("gpt", {"size": "27m"}) == expected


def test_gpt_size_fields_can_be_overridden() -> None:
    with torch.device("meta"):
        model = resolve_workload("gpt", {"size": "27m", "n_layer": 2}).model
    assert model.cfg == replace(GPT_SIZES["27m"], n_layer=2)
    assert model.cfg.d_model == 512


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        ({"d_model": 100, "n_head": 3}, "must divide d_model"),
        ({"size": "huge"}, "unknown gpt size"),
        ({"n_layer": 0}, "n_layer must be a positive integer"),
        ({"bogus": 1}, "bogus"),
    ],
)
def test_bad_gpt_arguments_are_workload_errors(args: dict[str, object], fragment: str) -> None:
    with pytest.raises(WorkloadError, match=fragment) as err:
        resolve_workload("gpt", args)
    assert str(err.value).startswith("workload 'gpt': ")


def test_hf_gpt2_without_transformers_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "transformers", None)  # makes the import fail
    with pytest.raises(WorkloadError, match=r"workload 'hf_gpt2': .*pip install transformers"):
        resolve_workload("hf_gpt2")


def test_hf_gpt2_gives_finite_scalar_loss_and_gradients() -> None:
    pytest.importorskip("transformers")
    args = {"n_layer": 1, "d_model": 64, "n_head": 2, "seq_len": 16, "vocab": 128}
    assert _loss_and_grads("hf_gpt2", args) == pytest.approx(math.log(128), rel=0.1)
    assert check_workload("hf_gpt2", args) > 0
