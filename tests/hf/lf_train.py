"""A training entry shaped like LLaMA-Factory's (``python -m llamafactory.launcher cfg.yaml
key=value ...``, which is what ``llamafactory-cli train`` runs in each rank), offline.

As its ``read_args`` and ``get_train_args`` do: the first argument is a YAML of arguments, the
rest ``key=value`` overrides laid over it (``deepspeed=ds_z2_config.json``,
``per_device_train_batch_size=2``; values read as YAML scalars, as OmegaConf's ``from_cli``
reads them), then ``HfArgumentParser.parse_dict(..., allow_extra_keys=False)`` over model,
data and ``TrainingArguments``, so an unknown key is an error; then a ``Trainer`` on blocks of
tokens. Nothing in it knows autotune.

It prints the micro-batch the model was fed (``micro-batch used: N``), the ZeRO stage its
Trainer's Accelerate configured (``client stage: N``) and, on rank 0, each logged loss
(``loss at step N: X``).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from typing import Any

import yaml
from clm_data import TokenBlocks, report_micro_batch  # beside this script
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    HfArgumentParser,
    Trainer,
    TrainingArguments,
    default_data_collator,
    set_seed,
)


@dataclass
class ModelArguments:
    n_layer: int = field(default=2)
    n_embd: int = field(default=64)
    vocab_size: int = field(default=128)


@dataclass
class DataArguments:
    block_size: int = field(default=32)
    num_blocks: int = field(default=400)


def read_args(argv: list[str]) -> dict[str, Any]:
    """The YAML at ``argv[0]`` with the ``key=value`` overrides after it."""
    with open(argv[0]) as file:
        args = yaml.safe_load(file)
    for override in argv[1:]:
        key, sep, value = override.partition("=")
        if not sep:
            raise ValueError(f"an override is key=value, got {override!r}")
        args[key] = yaml.safe_load(value)
    return args


def main() -> None:
    parser = HfArgumentParser((ModelArguments, DataArguments, TrainingArguments))
    model_args, data_args, training_args = parser.parse_dict(
        read_args(sys.argv[1:]), allow_extra_keys=False
    )
    set_seed(training_args.seed)
    config = AutoConfig.for_model(
        "gpt2",
        n_layer=model_args.n_layer,
        n_embd=model_args.n_embd,
        n_head=2,
        vocab_size=model_args.vocab_size,
        n_positions=data_args.block_size,
    )
    model = AutoModelForCausalLM.from_config(config)
    dataset = TokenBlocks(
        data_args.num_blocks, data_args.block_size, model_args.vocab_size, training_args.seed
    )
    trainer = Trainer(
        model=model, args=training_args, train_dataset=dataset, data_collator=default_data_collator
    )
    report_micro_batch(model)
    print(f"client stage: {trainer.accelerator.state.deepspeed_plugin.zero_stage}", flush=True)
    trainer.train()
    if trainer.is_world_process_zero():
        for entry in trainer.state.log_history:
            if "loss" in entry:
                print(f"loss at step {entry['step']}: {entry['loss']!r}", flush=True)


if __name__ == "__main__":
    main()
