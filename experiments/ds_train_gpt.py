"""A DeepSpeed-style training script for the script-mode overhead benchmark.

The default ``gpt`` workload's model, trained the way a user's script trains it: argparse
with HF-Trainer-like flags, a DataLoader over a synthetic token dataset, ``import deepspeed``.

    torchrun --nproc_per_node 2 experiments/ds_train_gpt.py --deepspeed ds_config.json
"""

from __future__ import annotations

import argparse

import deepspeed
import torch
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

from autotune.workloads import resolve_workload


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--deepspeed", type=str, required=True, help="DeepSpeed config file")
    parser.add_argument("--per_device_train_batch_size", type=int, default=4)
    parser.add_argument("--num_samples", type=int, default=256)
    parser.add_argument("--num_train_epochs", type=int, default=1)
    parser.add_argument("--local_rank", type=int, default=-1, help="set by the deepspeed launcher")
    args = parser.parse_args()

    deepspeed.init_distributed()
    workload = resolve_workload("gpt", seed=0)
    samples = workload.make_batch(args.num_samples, torch.Generator().manual_seed(0))
    dataset = TensorDataset(*samples)
    engine, _, _, _ = deepspeed.initialize(args=args, model=workload.model, config=args.deepspeed)
    loader = DataLoader(
        dataset,
        batch_size=args.per_device_train_batch_size,
        sampler=DistributedSampler(dataset, engine.world_size, engine.global_rank),
        drop_last=True,
    )
    for _epoch in range(args.num_train_epochs):
        for batch in loader:
            loss = engine(*batch)
            engine.backward(loss)
            engine.step()


if __name__ == "__main__":
    main()
