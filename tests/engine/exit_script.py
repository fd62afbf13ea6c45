"""A DeepSpeed script shaped like DeepSpeed's ``tests/small_model_debugging/test_model.py``:
``initialize(args=..., dist_init_required=True)`` makes the process group, a few steps over a
DistributedSampler, and the script ends without destroying the group, as most do.

An exit handler registered before ``initialize`` runs after every handler registered in it
(they run last registered first) and prints whether the process group is still up then: the
state interpreter shutdown would find."""

from __future__ import annotations

import argparse
import atexit
import json
import os
import tempfile

import torch
from torch.utils.data.distributed import DistributedSampler

import autotune as deepspeed  # was: import deepspeed


class SimpleModel(torch.nn.Module):
    def __init__(self, hidden_dim: int) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(hidden_dim, hidden_dim)
        self.cross_entropy_loss = torch.nn.CrossEntropyLoss()

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return self.cross_entropy_loss(self.linear(x), y)


parser = argparse.ArgumentParser()
parser.add_argument("--local_rank", type=int, default=0)
parser.add_argument("--zero", type=int, default=0)
args = parser.parse_args()


def report_group_at_exit() -> None:
    up = torch.distributed.is_initialized()
    print(f"rank {os.environ['RANK']} group up at exit: {up}", flush=True)


atexit.register(report_group_at_exit)
config = {
    "train_batch_size": 8,
    "steps_per_print": 1,
    "optimizer": {"type": "Adam", "params": {"lr": 0.00015}},
    "zero_optimization": {"stage": args.zero, "reduce_bucket_size": 20},
}
config_dir = tempfile.mkdtemp()
args.deepspeed_config = os.path.join(config_dir, "temp_config.json")
with open(args.deepspeed_config, "w") as file:
    json.dump(config, file)

torch.random.manual_seed(2222 + int(os.environ["RANK"]))
model = SimpleModel(hidden_dim=4)
model, _, _, _ = deepspeed.initialize(
    args=args, model=model, model_parameters=model.parameters(), dist_init_required=True
)
data = torch.randn(1000, 4)
labels = torch.empty(1000, dtype=torch.long).random_(4)
dataset = torch.utils.data.TensorDataset(data, labels)
loader = torch.utils.data.DataLoader(
    dataset, batch_size=model.train_micro_batch_size_per_gpu(), sampler=DistributedSampler(dataset)
)
for n, batch in enumerate(loader):
    loss = model(batch[0], batch[1])
    model.backward(loss)
    model.step()
    if n == 5:
        break
print(f"rank {torch.distributed.get_rank()} trained", flush=True)
