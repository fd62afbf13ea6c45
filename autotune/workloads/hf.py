"""Hugging Face ``transformers`` models built from their config class, with random weights.

Nothing is downloaded: the model comes from ``GPT2Config`` alone, so users can tune the shape
they really train without hub access. ``transformers`` is an optional dependency.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from autotune.workloads.base import Workload, WorkloadError


class _LossOnly(nn.Module):
    """Adapts a causal-LM ``forward(input_ids, labels=...)`` to ``forward(idx) -> loss``."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        # The HF model shifts the labels itself, so the inputs are their own targets.
        loss: torch.Tensor = self.model(input_ids=idx, labels=idx).loss
        return loss


def build_hf_gpt2(
    n_layer: int = 2,
    d_model: int = 256,
    n_head: int = 4,
    seq_len: int = 128,
    vocab: int = 8192,
    **config_kwargs: Any,
) -> Workload:
    """The ``hf_gpt2`` workload: ``transformers.GPT2LMHeadModel`` with random weights.

    Args:
        n_layer: ``GPT2Config.n_layer``.
        d_model: ``GPT2Config.n_embd``.
        n_head: ``GPT2Config.n_head``.
        seq_len: Tokens per sample; also ``GPT2Config.n_positions``.
        vocab: ``GPT2Config.vocab_size``.
        **config_kwargs: Any other ``GPT2Config`` field (dropouts default to 0 here).

    Like GPT-2, the LM head is tied to the token embedding, so one parameter belongs to two
    modules.

    Returns:
        The workload; ``make_batch`` gives ``(idx,)`` of shape ``(B, seq_len)``.

    Raises:
        WorkloadError: ``transformers`` is not installed.
    """
    try:
        from transformers import GPT2Config, GPT2LMHeadModel
    except ImportError as exc:
        raise WorkloadError(
            "hf_gpt2 needs the 'transformers' package (pip install transformers)"
        ) from exc
    fields: dict[str, Any] = {
        "resid_pdrop": 0.0,
        "embd_pdrop": 0.0,
        "attn_pdrop": 0.0,
        # GPT-2's special tokens (50256) must lie inside a smaller vocabulary.
        "bos_token_id": vocab - 1,
        "eos_token_id": vocab - 1,
    }
    fields.update(config_kwargs)
    config = GPT2Config(
        n_layer=n_layer,
        n_embd=d_model,
        n_head=n_head,
        n_positions=seq_len,
        vocab_size=vocab,
        **fields,
    )
    model = _LossOnly(GPT2LMHeadModel(config))

    def make_batch(micro_batch_size: int, generator: torch.Generator) -> tuple[torch.Tensor, ...]:
        idx = torch.randint(
            vocab, (micro_batch_size, seq_len), generator=generator, device=generator.device
        )
        return (idx,)

    return Workload(model=model, make_batch=make_batch)
