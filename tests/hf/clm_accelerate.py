"""A causal-LM training loop shaped like transformers' ``run_clm_no_trainer.py``, offline, with
Accelerate's DeepSpeed plugin.

As that example does with a DeepSpeed config: an ``Accelerator`` with a
``DeepSpeedPlugin(hf_ds_config=...)`` given ``--deepspeed_config``, or without it, as under
``accelerate launch --config_file deepspeed.yaml``, an ``Accelerator()`` that takes DeepSpeed
and the mixed precision from the launch; ``DummyOptim`` / ``DummyScheduler`` when the config
has an ``optimizer`` / ``scheduler`` section (a torch AdamW and a linear schedule when not),
``accelerator.prepare``, then ``accelerator.accumulate``, ``accelerator.backward``,
``optimizer.step()``, ``lr_scheduler.step()``, and a save through
``accelerator.get_state_dict``. Nothing in it knows autotune.

It prints the micro-batch the model was fed (``micro-batch used: N``), the ZeRO stage its
Accelerate configured (``client stage: N``) and, on the main process, each step's loss
(``loss at step N: X``).
"""

from __future__ import annotations

import argparse

import torch
from accelerate import Accelerator, DeepSpeedPlugin
from accelerate.utils import DummyOptim, DummyScheduler, set_seed
from clm_data import TokenBlocks, report_micro_batch  # beside this script
from transformers import AutoConfig, AutoModelForCausalLM, get_scheduler


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="Train a causal LM with Accelerate")
    parser.add_argument("--deepspeed_config", default=None)
    parser.add_argument("--per_device_train_batch_size", type=int, default=8)
    parser.add_argument("--gradient_accumulation_steps", type=int, default=1)
    parser.add_argument("--learning_rate", type=float, default=5e-4)
    parser.add_argument("--max_train_steps", type=int, default=20)
    parser.add_argument("--mixed_precision", default=None, choices=["no", "bf16"])
    parser.add_argument("--block_size", type=int, default=32)
    parser.add_argument("--num_blocks", type=int, default=512)
    parser.add_argument("--vocab_size", type=int, default=128)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--output_dir", default=None)
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    if args.deepspeed_config is not None:
        plugin = DeepSpeedPlugin(
            hf_ds_config=args.deepspeed_config,
            gradient_accumulation_steps=args.gradient_accumulation_steps,
        )
        accelerator = Accelerator(deepspeed_plugin=plugin, mixed_precision=args.mixed_precision)
    else:  # as run_clm_no_trainer.py under accelerate launch
        accelerator = Accelerator(gradient_accumulation_steps=args.gradient_accumulation_steps)
    ds_config = accelerator.state.deepspeed_plugin.deepspeed_config
    set_seed(args.seed)
    config = AutoConfig.for_model(
        "gpt2",
        n_layer=2,
        n_embd=64,
        n_head=2,
        vocab_size=args.vocab_size,
        n_positions=args.block_size,
    )
    model = AutoModelForCausalLM.from_config(config)
    dataset = TokenBlocks(args.num_blocks, args.block_size, args.vocab_size, args.seed)
    loader = torch.utils.data.DataLoader(
        dataset, batch_size=args.per_device_train_batch_size, shuffle=True
    )
    if "optimizer" in ds_config:
        optimizer = DummyOptim(model.parameters(), lr=args.learning_rate)
    else:
        optimizer = torch.optim.AdamW(model.parameters(), lr=args.learning_rate)
    if "scheduler" in ds_config:
        lr_scheduler = DummyScheduler(optimizer, total_num_steps=args.max_train_steps)
    else:
        lr_scheduler = get_scheduler(
            "linear",
            optimizer=optimizer,
            num_warmup_steps=0,
            num_training_steps=args.max_train_steps,
        )
    model, optimizer, loader, lr_scheduler = accelerator.prepare(
        model, optimizer, loader, lr_scheduler
    )
    report_micro_batch(accelerator.unwrap_model(model))
    print(f"client stage: {accelerator.state.deepspeed_plugin.zero_stage}", flush=True)
    print(f"model dtype: {next(model.parameters()).dtype}", flush=True)
    model.train()
    step = 0
    while step < args.max_train_steps:
        for batch in loader:
            with accelerator.accumulate(model):
                loss = model(**batch).loss
                accelerator.backward(loss)
                optimizer.step()
                lr_scheduler.step()
                optimizer.zero_grad()
            if accelerator.sync_gradients:
                step += 1
                if accelerator.is_main_process:
                    print(f"loss at step {step}: {loss.item()!r}", flush=True)
            if step >= args.max_train_steps:
                break
    if args.output_dir is not None:
        accelerator.wait_for_everyone()
        unwrapped = accelerator.unwrap_model(model)
        unwrapped.save_pretrained(
            args.output_dir,
            is_main_process=accelerator.is_main_process,
            save_function=accelerator.save,
            state_dict=accelerator.get_state_dict(model),
        )


if __name__ == "__main__":
    main()
