"""The default GPT trained by a script shaped like DeepSpeedExamples' training scripts.

The second script shape of ``bench_vs_deepspeed.py`` (``ds_train_gpt.py`` is the first, shaped
like a Hugging Face Trainer script): ``deepspeed.add_config_arguments`` (``--deepspeed`` a
switch, the config file after ``--deepspeed_config``), the script calling
``deepspeed.init_distributed(dist_backend="gloo")`` itself, ``deepspeed.initialize`` given
``args``, ``model_parameters`` and ``training_data`` and building the data loader (its
micro-batch is the config's, no batch-size flag), a step limit (``--steps``) around the epochs,
and no ``destroy_process_group`` at the end.

    deepspeed --num_gpus 2 experiments/ds_examples_gpt.py --deepspeed \\
        --deepspeed_config ds_config.json
"""

from __future__ import annotations

import argparse

import deepspeed
import torch
from torch.utils.data import TensorDataset

from autotune.workloads import resolve_workload


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30, help="optimizer steps to train")
    parser.add_argument("--num_samples", type=int, default=2048, help="synthetic sequences")
    parser.add_argument("--local_rank", type=int, default=-1, help="set by the launcher")
    parser = deepspeed.add_config_arguments(parser)
    args = parser.parse_args()

    deepspeed.init_distributed(dist_backend="gloo")
    workload = resolve_workload("gpt", seed=0)
    model = workload.model
    inputs, targets = workload.make_batch(args.num_samples, torch.Generator().manual_seed(0))
    # One tensor a sample, as a tokenized corpus is: the sequence and its next token.
    dataset = TensorDataset(torch.cat([inputs, targets[:, -1:]], dim=1))
    engine, _, loader, _ = deepspeed.initialize(
        args=args, model=model, model_parameters=model.parameters(), training_data=dataset
    )
    step = 0
    while step < args.steps:
        for (x,) in loader:
            loss = engine(x[:, :-1], x[:, 1:])
            engine.backward(loss)
            engine.step()
            step += 1
            if step >= args.steps:
                break


if __name__ == "__main__":
    main()
