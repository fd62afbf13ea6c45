"""Supervised fine-tuning with a LoRA adapter, shaped like TRL's own ``trl/scripts/sft.py``.

As that script runs with ``--use_peft --deepspeed ds.json``: ``TrlParser`` over
``ScriptArguments``, ``SFTConfig`` and ``ModelConfig``, the dataset from ``load_dataset`` (here
a local folder of JSON lines, so nothing is downloaded), an ``SFTTrainer`` given the model's
path and ``get_peft_config(model_args)``, ``trainer.train()`` and ``trainer.save_model()``.
The model and tokenizer are the ones a test saved with ``save_pretrained``. Nothing in it
knows autotune: under ``autotune run -- ...`` or ``python -m autotune.deepspeed`` the
Trainer's DeepSpeed is autotune's built-in engine.

It prints the micro-batch the model was fed (``micro-batch used: N``), the ZeRO stage its
Trainer's Accelerate configured (``client stage: N``) and, on rank 0, each logged loss
(``loss at step N: X``), for tests to compare.
"""

from __future__ import annotations

import os

from clm_data import report_micro_batch  # beside this script, as run_clm's utils
from datasets import load_dataset
from trl import ModelConfig, ScriptArguments, SFTConfig, SFTTrainer, TrlParser, get_peft_config


def main() -> None:
    parser = TrlParser((ScriptArguments, SFTConfig, ModelConfig))
    script_args, training_args, model_args = parser.parse_args_and_config()
    dataset = load_dataset(script_args.dataset_name)
    trainer = SFTTrainer(
        model=model_args.model_name_or_path,
        args=training_args,
        train_dataset=dataset[script_args.dataset_train_split],
        peft_config=get_peft_config(model_args),
    )
    report_micro_batch(trainer.model)
    print(f"client stage: {trainer.accelerator.state.deepspeed_plugin.zero_stage}", flush=True)
    trainer.train()
    trainer.save_model(training_args.output_dir)
    if trainer.is_world_process_zero():
        for entry in trainer.state.log_history:
            if "loss" in entry:
                print(f"loss at step {entry['step']}: {entry['loss']!r}", flush=True)
        print(f"saved to {os.path.abspath(training_args.output_dir)}", flush=True)


if __name__ == "__main__":
    main()
