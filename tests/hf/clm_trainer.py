"""A causal-LM training script shaped like transformers' ``run_clm.py``, offline.

As ``examples/pytorch/language-modeling/run_clm.py`` does: ``HfArgumentParser`` over model,
data and ``TrainingArguments`` (so ``--deepspeed ds_config.json``,
``--per_device_train_batch_size``, ``--gradient_accumulation_steps``, ``--max_steps``, ...), a
model built from its config (``AutoConfig.for_model``, random weights, nothing downloaded) or
loaded from a local ``--model_name_or_path``,
blocks of tokens as the dataset, a ``Trainer``, ``trainer.train()`` and
``trainer.save_model()``. Nothing in it knows autotune: under ``autotune run -- ...`` or
``python -m autotune.deepspeed`` the Trainer's DeepSpeed is autotune's built-in engine.

It prints the micro-batch the model was fed (``micro-batch used: N``) and, on rank 0, each
logged loss (``loss at step N: X``), for tests to compare.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field

import torch
from clm_data import TokenBlocks, report_micro_batch  # beside this script, as run_clm's utils
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
    model_name_or_path: str | None = field(default=None)
    model_type: str = field(default="gpt2")
    n_layer: int = field(default=2)
    n_embd: int = field(default=64)
    n_head: int = field(default=2)
    vocab_size: int = field(default=128)


@dataclass
class DataTrainingArguments:
    block_size: int = field(default=32)
    num_blocks: int = field(default=512)


def main() -> None:
    parser = HfArgumentParser((ModelArguments, DataTrainingArguments, TrainingArguments))
    model_args, data_args, training_args = parser.parse_args_into_dataclasses()
    set_seed(training_args.seed)
    config = AutoConfig.for_model(
        model_args.model_type,
        n_layer=model_args.n_layer,
        n_embd=model_args.n_embd,
        n_head=model_args.n_head,
        vocab_size=model_args.vocab_size,
        n_positions=data_args.block_size,
    )
    if model_args.model_name_or_path:  # as run_clm.py: a saved model, else one from its config
        model = AutoModelForCausalLM.from_pretrained(model_args.model_name_or_path)
    else:
        model = AutoModelForCausalLM.from_config(config)
    train_dataset = TokenBlocks(
        data_args.num_blocks, data_args.block_size, model_args.vocab_size, training_args.seed
    )
    trainer = Trainer(
        model=model,
        args=training_args,
        train_dataset=train_dataset,
        data_collator=default_data_collator,
    )
    report_micro_batch(model)
    trainer.train()
    trainer.save_model()
    if trainer.is_world_process_zero():
        for entry in trainer.state.log_history:
            if "loss" in entry:
                print(f"loss at step {entry['step']}: {entry['loss']!r}", flush=True)
        print(f"saved to {os.path.abspath(training_args.output_dir)}", flush=True)
    if training_args.use_cpu and torch.distributed.is_initialized():
        # The plain-DDP reference run leaves without tearing torch down. Freeing DDP's Reducer
        # frees its gloo group, which joins its worker threads while holding the GIL; a worker
        # still dropping the last collective's Python tensors needs the GIL: a hang or a
        # SIGABRT at exit (about 1 run in 10 here, barrier and destroy_process_group or not).
        # That is torch's, not the Trainer's; under autotune the script ends as run_clm.py
        # does and autotune destroys the group it made.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)


if __name__ == "__main__":
    main()
