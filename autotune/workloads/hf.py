"""Hugging Face ``transformers`` models built from their config class, with random weights.

``hf:<model_type>`` builds any architecture ``transformers`` knows from its default config
(``AutoConfig.for_model(model_type, **overrides)``) with a training head and synthetic batches.
Nothing is downloaded, so users can tune the shape they really train without hub access.
``transformers`` is an optional dependency.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from autotune.workloads.args import HF_PREFIX as HF_PREFIX  # its home: torch-free
from autotune.workloads.args import WorkloadError, did_you_mean
from autotune.workloads.base import Workload

# Heads by preference: an encoder (bert) pre-trains as a masked LM, a decoder (gpt2, llama)
# has no masked head and trains as a causal LM; anything else gets sequence classification.
HEADS = ("masked_lm", "causal_lm", "sequence_classification")


class _LossOnly(nn.Module):
    """Adapts a model with a head, ``forward(input_ids, labels=...)``, to return the loss.

    ``empty_cache``, where given, makes the keyword arguments that hand the model an empty
    key/value cache each step (:func:`_empty_cache_factory`).
    """

    def __init__(
        self, model: nn.Module, empty_cache: Callable[[], dict[str, Any]] | None = None
    ) -> None:
        super().__init__()
        self.model = model
        self.empty_cache = empty_cache

    def forward(self, idx: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        cache = self.empty_cache() if self.empty_cache is not None else {}
        loss: torch.Tensor = self.model(input_ids=idx, labels=labels, **cache).loss
        return loss


def _empty_cache_factory(
    transformers: Any, model: nn.Module
) -> Callable[[], dict[str, Any]] | None:
    """What hands a causal LM an empty key/value cache, or None where none is needed.

    Without a cache, transformers' causal-mask code (``masking_utils``, 4.53 on) reads the
    position ids' values to find sequences packed into one row: a host sync on a GPU, and an
    error on the meta device, where ``autotune plan`` profiles the model. Training under
    activation checkpointing runs without one (transformers drops it), so only checkpointed
    plans failed. With a cache the mask comes from its (empty) length instead; the batches
    here hold one sequence a row, so the answer is the same, and a checkpointed layer still
    drops the cache. Without checkpointing the model makes the same cache itself
    (``use_cache``): nothing changes there.
    """
    if not hasattr(getattr(transformers, "masking_utils", None), "find_packed_sequence_indices"):
        return None  # an older transformers: no such detection
    config = getattr(model, "config", None)
    if config is None or not getattr(config, "use_cache", False):
        return None  # the user asked for no cache: leave the model as it is
    parameters = inspect.signature(model.forward).parameters
    name = next((n for n in ("cache", "past_key_values") if n in parameters), None)
    if name is None:
        return None

    def empty_cache() -> dict[str, Any]:
        return {name: transformers.DynamicCache(config=config)}

    return empty_cache


def _transformers() -> Any:
    try:
        import transformers
    except ImportError as exc:
        raise WorkloadError(
            "hf workloads need the 'transformers' package (pip install transformers)"
        ) from exc
    return transformers


def _head_class(transformers: Any, config: Any, head: str | None) -> tuple[str, Any]:
    """The head to train and its ``AutoModelFor*`` class: ``head``, else the first that fits."""
    auto = {
        "causal_lm": transformers.AutoModelForCausalLM,
        "masked_lm": transformers.AutoModelForMaskedLM,
        "sequence_classification": transformers.AutoModelForSequenceClassification,
    }
    if head is not None and head not in auto:
        raise WorkloadError(f"head {head!r} is not one of {', '.join(HEADS)}")
    for name in [head] if head else HEADS:
        assert name is not None
        # The auto class's mapping is keyed by config class: membership says it has the head.
        if type(config) in auto[name]._model_mapping:  # no public lookup
            return name, auto[name]
    raise WorkloadError(f"model type {config.model_type!r} has no {head or 'training'} head")


def build_hf(
    model_type: str,
    seq_len: int = 128,
    head: str | None = None,
    activation_checkpointing: bool = False,
    attn_implementation: str | None = None,
    extra_config: dict[str, Any] | None = None,
    **overrides: Any,
) -> Workload:
    """The ``hf:<model_type>`` workload: a ``transformers`` model with random weights.

    Args:
        model_type: a ``transformers`` model type (``gpt2``, ``bert``, ``distilbert``,
            ``deberta-v2``, ``llama``, ...).
        seq_len: tokens per sample (at most the config's position limit).
        head: ``causal_lm``, ``masked_lm`` or ``sequence_classification``; default the first
            the architecture has, in that order.
        activation_checkpointing: recompute each layer's activations in backward
            (``gradient_checkpointing_enable``, non-reentrant, as the Trainer's
            ``--gradient_checkpointing`` does).
        attn_implementation: ``eager``, ``sdpa``, ... (default: the library's choice); older
            transformers ran every model eagerly, keeping each layer's attention scores.
        extra_config: config fields set as given, unchecked: those an architecture reads
            without declaring them (DeBERTa-v2's ``position_buckets``, ``share_att_key``).
        **overrides: fields of the model's config (``n_layer=4``, ``num_hidden_layers=2``,
            ``vocab_size=8192``); dropouts default to 0 here so steps are comparable.

    Returns:
        The workload; ``make_batch`` gives ``(input_ids, labels)``: random token ids and, for a
        language-model head, the same ids as labels (the model shifts them for a causal LM),
        else random class labels.

    Raises:
        WorkloadError: ``transformers`` is missing, the model type or a field is unknown, or the
            architecture has no such head.
    """
    transformers = _transformers()
    try:
        defaults = transformers.AutoConfig.for_model(model_type)
    except ValueError as exc:
        hint = did_you_mean(model_type, transformers.CONFIG_MAPPING.keys())
        raise WorkloadError(
            f"unknown transformers model type {model_type!r}{hint} (see "
            "transformers.CONFIG_MAPPING)"
        ) from exc
    fields: dict[str, Any] = {k: 0.0 for k in _DROPOUTS if hasattr(defaults, k)}
    for key in overrides:
        if not hasattr(defaults, key):
            hint = did_you_mean(key, defaults.to_dict())
            raise WorkloadError(f"{type(defaults).__name__} has no field {key!r}{hint}")
    vocab = int(overrides.get("vocab_size", defaults.vocab_size))
    # Special tokens outside a reduced vocabulary would index past the embedding.
    for key in ("bos_token_id", "eos_token_id", "pad_token_id"):
        token = getattr(defaults, key, None)
        if isinstance(token, int) and token >= vocab:
            fields[key] = vocab - 1
    transformers.logging.set_verbosity_error()  # "add is_decoder", "loss_type=None", ...
    config = transformers.AutoConfig.for_model(
        model_type, **{**fields, **overrides, **(extra_config or {})}
    )
    limit = getattr(config, "max_position_embeddings", None) or getattr(config, "n_positions", None)
    if limit is not None and seq_len > limit:
        raise WorkloadError(f"seq_len {seq_len} exceeds the model's {limit} positions")
    if not isinstance(activation_checkpointing, bool):
        raise WorkloadError(
            f"activation_checkpointing must be true or false, got {activation_checkpointing!r}"
        )
    head_name, auto_class = _head_class(transformers, config, head)
    chosen = {"attn_implementation": attn_implementation} if attn_implementation else {}
    try:
        inner = auto_class.from_config(config, **chosen)
    except ValueError as exc:  # an attention implementation the architecture lacks
        raise WorkloadError(str(exc).splitlines()[0]) from exc
    causal = head_name == "causal_lm"
    model = _LossOnly(inner, _empty_cache_factory(transformers, inner) if causal else None)
    if activation_checkpointing and not getattr(inner, "supports_gradient_checkpointing", False):
        raise WorkloadError(f"model type {model_type!r} cannot checkpoint activations")

    def set_checkpointing(on: bool) -> None:
        # transformers 5 calls it activation checkpointing (the old name warns); 4.x does not.
        if hasattr(inner, "activation_checkpointing_enable"):
            if on:
                inner.activation_checkpointing_enable({"use_reentrant": False})
            else:
                inner.activation_checkpointing_disable()
        elif on:
            inner.gradient_checkpointing_enable(
                gradient_checkpointing_kwargs={"use_reentrant": False}
            )
        else:
            inner.gradient_checkpointing_disable()

    if activation_checkpointing:
        set_checkpointing(True)
    num_labels = int(getattr(config, "num_labels", 2))

    def make_batch(micro_batch_size: int, generator: torch.Generator) -> tuple[torch.Tensor, ...]:
        shape = (micro_batch_size, seq_len)
        idx = torch.randint(vocab, shape, generator=generator, device=generator.device)
        if head_name == "sequence_classification":
            labels = torch.randint(
                num_labels, (micro_batch_size,), generator=generator, device=generator.device
            )
            return (idx, labels)
        return (idx, idx)

    switch = set_checkpointing if getattr(inner, "supports_gradient_checkpointing", False) else None
    return Workload(model=model, make_batch=make_batch, activation_checkpointing=switch)


_DROPOUTS = (
    "dropout",
    "attention_dropout",
    "activation_dropout",
    "hidden_dropout_prob",
    "attention_probs_dropout_prob",
    "resid_pdrop",
    "embd_pdrop",
    "attn_pdrop",
    "hidden_dropout",
    "classifier_dropout",
    "seq_classif_dropout",
)


def build_hf_gpt2(
    n_layer: int = 2,
    d_model: int = 256,
    n_head: int = 4,
    seq_len: int = 128,
    vocab: int = 8192,
    **config_kwargs: Any,
) -> Workload:
    """The ``hf_gpt2`` workload: ``hf:gpt2`` at a small size, in the built-in gpt's terms.

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
        The workload; ``make_batch`` gives ``(idx, idx)`` of shape ``(B, seq_len)``.

    Raises:
        WorkloadError: ``transformers`` is not installed.
    """
    return build_hf(
        "gpt2",
        seq_len=seq_len,
        n_layer=n_layer,
        n_embd=d_model,
        n_head=n_head,
        n_positions=seq_len,
        vocab_size=vocab,
        **config_kwargs,
    )
