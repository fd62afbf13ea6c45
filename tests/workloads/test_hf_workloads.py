"""``hf:<model_type>``: transformers architectures built offline, trained by ``autotune run``."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from typer.testing import CliRunner

from autotune.cli import app
from autotune.results import load_results
from autotune.workloads import WorkloadError, check_workload, resolve_workload

# Tiny shapes in each architecture's own field names (no download: the default config class).
TINY = {
    "gpt2": {"n_layer": 1, "n_embd": 32, "n_head": 2, "vocab_size": 128},
    "bert": {
        "num_hidden_layers": 1,
        "hidden_size": 32,
        "num_attention_heads": 2,
        "intermediate_size": 64,
        "vocab_size": 128,
    },
    "distilbert": {"n_layers": 1, "dim": 32, "n_heads": 2, "hidden_dim": 64, "vocab_size": 128},
    "deberta-v2": {
        "num_hidden_layers": 1,
        "hidden_size": 32,
        "num_attention_heads": 2,
        "intermediate_size": 64,
        "vocab_size": 128,
    },
}
HEADS = {
    "gpt2": "GPT2LMHeadModel",
    "bert": "BertForMaskedLM",
    "distilbert": "DistilBertForMaskedLM",
    "deberta-v2": "DebertaV2ForMaskedLM",
}


@pytest.mark.parametrize("model_type", sorted(TINY))
def test_each_architecture_trains_with_its_language_model_head(model_type: str) -> None:
    pytest.importorskip("transformers")
    args = {"seq_len": 16, **TINY[model_type]}
    workload = resolve_workload(f"hf:{model_type}", args)
    assert type(workload.model.model).__name__ == HEADS[model_type]
    inputs = workload.make_batch(3, torch.Generator().manual_seed(0))
    assert inputs[0].shape == (3, 16)
    loss = workload.model(*inputs)
    loss.backward()
    # Random weights predict about uniformly over the vocabulary.
    assert loss.item() == pytest.approx(math.log(128), rel=0.15)
    assert all(p.grad is not None for p in workload.model.parameters() if p.requires_grad)
    assert check_workload(f"hf:{model_type}", args) == sum(
        p.numel() for p in workload.model.parameters()
    )


def test_a_head_can_be_chosen() -> None:
    pytest.importorskip("transformers")
    args = {"seq_len": 8, "head": "sequence_classification", **TINY["bert"]}
    workload = resolve_workload("hf:bert", args)
    idx, labels = workload.make_batch(4, torch.Generator().manual_seed(0))
    assert labels.shape == (4,) and workload.model(idx, labels).dim() == 0


@pytest.mark.parametrize(
    ("spec", "args", "fragment"),
    [
        ("hf:nonesuch", {}, "unknown transformers model type 'nonesuch'"),
        ("hf:", {}, "expected hf:<model_type>"),
        ("hf:bert", {"n_layerz": 2}, "BertConfig has no field 'n_layerz'"),
        ("hf:bret", {}, r"unknown transformers model type 'bret' \(did you mean 'bert'\?\)"),
        ("hf:gpt2", {"n_layr": 2}, r"GPT2Config has no field 'n_layr' \(did you mean 'n_layer'"),
        ("hf:gpt2", {"seq_len": 4096, **TINY["gpt2"]}, "exceeds the model's 1024 positions"),
        ("hf:bert", {"head": "causal", **TINY["bert"]}, "head 'causal' is not one of"),
    ],
)
def test_bad_hf_specs_are_one_line_workload_errors(
    spec: str, args: dict[str, object], fragment: str
) -> None:
    pytest.importorskip("transformers")
    with pytest.raises(WorkloadError, match=fragment) as err:
        resolve_workload(spec, args)
    assert str(err.value).startswith(f"workload {spec!r}: ") and "\n" not in str(err.value)


def test_without_transformers_the_error_says_how_to_get_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "transformers", None)  # makes the import fail
    with pytest.raises(WorkloadError, match=r"workload 'hf:bert': .*pip install transformers"):
        resolve_workload("hf:bert")


@pytest.mark.multirank
def test_autotune_run_tunes_an_hf_workload(tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    # bert: its int64 buffers (position and token type ids) beside float32 weights once made
    # the ranks' start-up broadcasts go in different orders, and gloo aborted a rank.
    model_type = "bert"
    config = {
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
        "train_micro_batch_size_per_gpu": 2,
        "zero_optimization": {"stage": [0, 2]},
        "autotuning": {
            "start_profile_step": 1,
            "end_profile_step": 2,
            "tuner_type": "gridsearch",
            "num_remeasure": 0,
            "timeout_s": 90,
        },
    }
    path = tmp_path / "ds_config.json"
    path.write_text(json.dumps(config))
    args = [f"{key}={value}" for key, value in {"seq_len": 8, **TINY[model_type]}.items()]
    result = CliRunner().invoke(
        app,
        [
            "run",
            "-c",
            str(path),
            "--workload",
            f"hf:{model_type}",
            *[item for arg in args for item in ("-a", arg)],
            "--results-dir",
            str(tmp_path / "results"),
            "--runner",
            "local",
            "--device-memory",
            "1GiB",
            "-q",
        ],
    )
    assert result.exit_code == 0, result.output
    frame = load_results(tmp_path / "results")
    assert set(frame["status"]) == {"ok"}, frame[["name", "status", "error"]].to_string()
    assert set(frame["zero_stage"]) == {0, 2}
    assert (frame["throughput"] > 0).all()


DECODERS = {
    "llama": {
        "num_hidden_layers": 2,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "vocab_size": 128,
    },
    "mistral": {
        "num_hidden_layers": 2,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "vocab_size": 128,
    },
    "qwen2": {
        "num_hidden_layers": 2,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "vocab_size": 128,
    },
    "gpt2": TINY["gpt2"],
}


@pytest.mark.parametrize("model_type", sorted(DECODERS))
def test_a_decoder_profiles_on_meta_with_checkpointing_on(model_type: str) -> None:
    # transformers' causal mask reads the positions' values where the model has no cache,
    # as under checkpointing: on meta that failed (Tensor.item()) for every decoder.
    from autotune.profiling.model_info import model_info_on_meta

    args = {**DECODERS[model_type], "seq_len": 64, "attn_implementation": "sdpa"}
    with torch.device("meta"):
        workload = resolve_workload(f"hf:{model_type}", args)
    info = model_info_on_meta(workload, "bf16", workload.activation_checkpointing)
    assert info.can_checkpoint
    assert 0 < info.step_bytes(True) < info.step_bytes(False)
    assert info.recompute_flops_per_sample > 0


def test_the_empty_cache_changes_nothing_a_step_computes() -> None:
    workload = resolve_workload("hf:llama", {**DECODERS["llama"], "seq_len": 16})
    batch = workload.make_batch(2, torch.Generator().manual_seed(0))
    model: Any = workload.model
    assert model.empty_cache is not None
    switch = workload.activation_checkpointing
    assert switch is not None
    for checkpointed in (False, True):
        switch(checkpointed)
        with_cache = model(*batch)
        model.empty_cache, kept = None, model.empty_cache
        without = model(*batch)
        model.empty_cache = kept
        assert torch.equal(with_cache, without)
