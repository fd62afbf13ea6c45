"""A DeepSpeed training script shaped like DeepSpeedExamples' autotuning/hf ones, tuned by
``autotune run -- ds_script.py --deepspeed ds_config.json ...`` in the tests.

HF-Trainer-like flags (``--per_device_train_batch_size``, ``--deepspeed``), a real DataLoader
with a DistributedSampler over a small synthetic dataset, a tiny model, ``import deepspeed``.
It prints the batch its loader really produced, so a test can check that
``autotuning.arg_mappings`` made the loader agree with the experiment's micro-batch, and
its process id and losses, so a test can see which experiments shared a process and that
they trained alike.

``--faults z1_8=raise,z2_4=hang,...`` makes the experiment at that (ZeRO stage, loader batch)
fail on rank 1 at its second step: ``raise`` an exception, ``hang`` forever, or ``early``
(both ranks) stop training after one step as if the data ran out.
"""

from __future__ import annotations

import argparse
import os
import time

import deepspeed
import torch
import torch.distributed as dist
from deepspeed.accelerator import get_accelerator
from deepspeed.utils import log_dist
from torch import nn
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="tiny regression, DeepSpeed style")
    parser.add_argument("--deepspeed", type=str, required=True, help="DeepSpeed config file")
    parser.add_argument("--per_device_train_batch_size", type=int, default=8)
    parser.add_argument("--num_train_epochs", type=int, default=2)
    parser.add_argument("--num_samples", type=int, default=256)
    parser.add_argument("--local_rank", type=int, default=-1)
    parser.add_argument("--init", choices=["script", "engine"], default="script")
    parser.add_argument("--faults", type=str, default="")
    return parser.parse_args()


class Regressor(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 1))

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return nn.functional.mse_loss(self.net(x), y)


def main() -> None:
    args = parse_args()
    if args.init == "script":  # as many scripts do; otherwise initialize() makes the group
        dist.init_process_group("gloo")
    torch.manual_seed(0)
    features = torch.randn(args.num_samples, 16)
    dataset = TensorDataset(features, features.sum(dim=1, keepdim=True))
    model = Regressor()
    engine, _, _, _ = deepspeed.initialize(
        args=args, model=model, model_parameters=model.parameters(), config=args.deepspeed
    )
    loader = DataLoader(
        dataset,
        batch_size=args.per_device_train_batch_size,
        sampler=DistributedSampler(dataset, dist.get_world_size(), dist.get_rank()),
        drop_last=True,
    )
    faults = dict(item.split("=") for item in args.faults.split(",") if item)
    fault = faults.get(f"z{engine.zero_optimization_stage()}_{args.per_device_train_batch_size}")
    device = get_accelerator().device_name(engine.local_rank)
    log_dist(f"training on {device}", ranks=[-1])
    step = 0
    for _epoch in range(args.num_train_epochs):
        for x, y in loader:
            if step == 0:
                print(f"loader_batch={x.shape[0]} pid={os.getpid()}", flush=True)
            if step == 1 and fault == "early":
                return
            if step == 1 and dist.get_rank() == 1:
                if fault == "raise":
                    raise RuntimeError("injected failure in the training loop")
                if fault == "hang":
                    time.sleep(3600)
            loss = engine(x.to(device), y.to(device))
            engine.backward(loss)
            engine.step()
            print(f"loss={loss.item():.6f}", flush=True)
            step += 1
    print(f"finished {step} steps", flush=True)


if __name__ == "__main__":
    main()
