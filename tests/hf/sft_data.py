"""What the SFT tests share: a tiny Llama with a word-level tokenizer, and a folder of JSON
lines to fine-tune it on, saved as ``from_pretrained`` and ``load_dataset`` read them (nothing
is downloaded)."""

from __future__ import annotations

import json
import random
from pathlib import Path

WORDS = [f"w{i}" for i in range(60)]


def save_sft_checkpoint(root: Path, num_examples: int = 256) -> Path:
    """``root/model`` (the model and its tokenizer) and ``root/data/train.jsonl`` (counting
    sentences); ``root``."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import AutoConfig, AutoModelForCausalLM, PreTrainedTokenizerFast, set_seed

    specials = ["<pad>", "<unk>", "<eos>", "<bos>"]
    vocab = {token: i for i, token in enumerate(specials + WORDS)}
    words = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    words.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=words,
        pad_token="<pad>",
        unk_token="<unk>",
        eos_token="<eos>",
        bos_token="<bos>",
    )
    tokenizer.save_pretrained(root / "model")
    set_seed(0)
    config = AutoConfig.for_model(
        "llama",
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        vocab_size=len(vocab),
        max_position_embeddings=64,
        pad_token_id=0,
        eos_token_id=2,
        bos_token_id=3,
    )
    AutoModelForCausalLM.from_config(config).save_pretrained(root / "model")
    draw = random.Random(0)
    (root / "data").mkdir()
    with open(root / "data" / "train.jsonl", "w") as lines:
        for _ in range(num_examples):
            start, length = draw.randrange(len(WORDS)), draw.randrange(8, 20)
            text = " ".join(WORDS[(start + k) % len(WORDS)] for k in range(length))
            lines.write(json.dumps({"text": text}) + "\n")
    return root
