"""A GPT-style decoder trained on random tokens: the default workload.

Written in the style of nanoGPT's ``model.py``: pre-LN blocks of causal self-attention
(``F.scaled_dot_product_attention``) and a 4x GELU MLP, learned position embeddings, and a
final LayerNorm.

The LM head is *not* tied to the token embedding. Tying saves ``vocab * d_model`` parameters,
but then one parameter belongs to two modules, which every ZeRO stage (and stage 3's gather
hooks in particular) must special-case; an untied head keeps "one parameter, one owner" true
for the engine. It also gives the ``27m`` size its 27.3M parameters.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from autotune.workloads.base import Workload


@dataclass(frozen=True)
class GPTConfig:
    """The shape of a GPT model."""

    n_layer: int = 2
    """Number of transformer blocks."""
    d_model: int = 256
    """Width of the residual stream."""
    n_head: int = 4
    """Attention heads per block; must divide ``d_model``."""
    seq_len: int = 128
    """Tokens per sample (and number of learned positions)."""
    vocab: int = 8192
    """Vocabulary size."""
    dropout: float = 0.0
    """Dropout probability; 0 keeps step times free of RNG work."""
    activation_checkpointing: bool = False
    """Recompute each block's activations in backward instead of keeping them (what
    ``--gradient_checkpointing`` does in HF scripts): a block then holds only its input."""

    def __post_init__(self) -> None:
        for name in ("n_layer", "d_model", "n_head", "seq_len", "vocab"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if self.d_model % self.n_head:
            raise ValueError(f"n_head ({self.n_head}) must divide d_model ({self.d_model})")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {self.dropout!r}")
        if not isinstance(self.activation_checkpointing, bool):
            raise ValueError(
                "activation_checkpointing must be true or false, "
                f"got {self.activation_checkpointing!r}"
            )


GPT_SIZES: dict[str, GPTConfig] = {
    # One experiment (a few steps at micro-batch 4, world size 2) takes seconds on 2 CPU cores.
    "small": GPTConfig(),
    # The engine benchmark: 27,341,824 parameters.
    "27m": GPTConfig(n_layer=6, d_model=512, n_head=8, seq_len=128, vocab=8192),
}


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.n_head = cfg.n_head
        self.dropout = cfg.dropout
        self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model, bias=False)
        self.proj = nn.Linear(cfg.d_model, cfg.d_model, bias=False)
        self.resid_drop = nn.Dropout(cfg.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, width = x.shape
        q, k, v = self.qkv(x).split(width, dim=2)
        # (B, T, C) -> (B, heads, T, head_dim)
        q, k, v = (t.view(batch, seq, self.n_head, -1).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(
            q, k, v, dropout_p=self.dropout if self.training else 0.0, is_causal=True
        )
        y = y.transpose(1, 2).contiguous().view(batch, seq, width)
        return self.resid_drop(self.proj(y))


class FeedForward(nn.Module):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.fc = nn.Linear(cfg.d_model, 4 * cfg.d_model, bias=False)
        self.proj = nn.Linear(4 * cfg.d_model, cfg.d_model, bias=False)
        self.drop = nn.Dropout(cfg.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.drop(self.proj(F.gelu(self.fc(x))))


class Block(nn.Module):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(cfg.d_model)
        self.attn = CausalSelfAttention(cfg)
        self.ln_2 = nn.LayerNorm(cfg.d_model)
        self.mlp = FeedForward(cfg)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    """A decoder-only transformer; ``forward(idx, targets)`` returns the mean cross-entropy."""

    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.wte = nn.Embedding(cfg.vocab, cfg.d_model)
        self.wpe = nn.Embedding(cfg.seq_len, cfg.d_model)
        self.drop = nn.Dropout(cfg.dropout)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layer))
        self.ln_f = nn.LayerNorm(cfg.d_model)
        self.lm_head = nn.Linear(cfg.d_model, cfg.vocab, bias=False)
        self.apply(self._init_weights)
        # GPT-2: scale the projections into the residual stream by 1/sqrt(number of them), so
        # the residual's variance at init does not grow with depth.
        for name, param in self.named_parameters():
            if name.endswith("proj.weight"):
                nn.init.normal_(param, mean=0.0, std=0.02 / math.sqrt(2 * cfg.n_layer))

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, nn.Linear | nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        seq = idx.shape[1]
        if seq > self.cfg.seq_len:
            raise ValueError(f"sequence of {seq} tokens is longer than seq_len={self.cfg.seq_len}")
        pos = torch.arange(seq, device=idx.device)
        x = self.drop(self.wte(idx) + self.wpe(pos))
        recompute = self.cfg.activation_checkpointing and torch.is_grad_enabled()
        for block in self.blocks:
            # Non-reentrant: backward re-runs the block's forward, module hooks included, so a
            # stage-3 engine gathers the block's parameters again for the recompute.
            x = (
                checkpoint(block, x, use_reentrant=False, preserve_rng_state=self.cfg.dropout > 0)
                if recompute
                else block(x)
            )
        logits = self.lm_head(self.ln_f(x))
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def build_gpt(
    size: str = "small",
    *,
    n_layer: int | None = None,
    d_model: int | None = None,
    n_head: int | None = None,
    seq_len: int | None = None,
    vocab: int | None = None,
    dropout: float | None = None,
    activation_checkpointing: bool | None = None,
) -> Workload:
    """The ``gpt`` workload: a GPT decoder on uniformly random tokens.

    Args:
        size: A named shape from ``GPT_SIZES`` (``"small"`` or ``"27m"``); the other arguments
            override its fields.
        n_layer: Number of transformer blocks.
        d_model: Residual stream width.
        n_head: Attention heads; must divide ``d_model``.
        seq_len: Tokens per sample.
        vocab: Vocabulary size.
        dropout: Dropout probability.
        activation_checkpointing: Recompute each block in backward (less memory, about a
            third more compute).

    Returns:
        The workload; ``make_batch`` gives ``(idx, targets)``, both ``(B, seq_len)`` int64.

    Example:
        >>> wl = build_gpt("27m", n_layer=4)
        >>> loss = wl.model(*wl.make_batch(2, torch.Generator().manual_seed(0)))
        >>> loss.shape, round(loss.item()) == round(math.log(wl.model.cfg.vocab))  # near ln(V)
        (torch.Size([]), True)
    """
    if size not in GPT_SIZES:
        raise ValueError(f"unknown gpt size {size!r}; sizes are {', '.join(GPT_SIZES)}")
    overrides: dict[str, Any] = {
        "n_layer": n_layer,
        "d_model": d_model,
        "n_head": n_head,
        "seq_len": seq_len,
        "vocab": vocab,
        "dropout": dropout,
        "activation_checkpointing": activation_checkpointing,
    }
    cfg = replace(GPT_SIZES[size], **{k: v for k, v in overrides.items() if v is not None})
    model = GPT(cfg)

    def make_batch(micro_batch_size: int, generator: torch.Generator) -> tuple[torch.Tensor, ...]:
        tokens = torch.randint(
            cfg.vocab,
            (micro_batch_size, cfg.seq_len + 1),
            generator=generator,
            device=generator.device,
        )
        # Next-token targets; random tokens make the loss start (and stay) near log(vocab).
        return tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()

    def set_checkpointing(on: bool) -> None:
        model.cfg = replace(model.cfg, activation_checkpointing=on)

    return Workload(model=model, make_batch=make_batch, activation_checkpointing=set_checkpointing)
