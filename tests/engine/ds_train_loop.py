"""A DeepSpeed-style training script, run by ``torchrun --nproc_per_node 2`` in the tests.

It uses autotune exactly as it would use DeepSpeed (``import autotune as deepspeed``): the
engine makes its process group from torchrun's environment and builds the data loader.
"""

from __future__ import annotations

import sys

import torch
import torch.distributed as dist

import autotune as deepspeed

torch.set_num_threads(1)
stage = int(sys.argv[1])
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
inputs = torch.randn(64, 8)
data = torch.utils.data.TensorDataset(inputs, inputs.sum(dim=1, keepdim=True))
config = {
    "train_batch_size": 16,
    "gradient_accumulation_steps": 2,
    "optimizer": {"type": "AdamW", "params": {"lr": 0.01}},
    "scheduler": {
        "type": "WarmupLR",
        "params": {"warmup_min_lr": 0.001, "warmup_max_lr": 0.01, "warmup_num_steps": 4},
    },
    "gradient_clipping": 1.0,
    "zero_optimization": {"stage": stage, "overlap_comm": True, "reduce_bucket_size": 100},
}
engine, optimizer, loader, scheduler = deepspeed.initialize(
    model=model, model_parameters=model.parameters(), config=config, training_data=data
)
assert engine.train_micro_batch_size_per_gpu() == 4 and dist.get_world_size() == 2
losses = []
for _epoch in range(3):
    for x, y in loader:
        loss = torch.nn.functional.mse_loss(engine(x), y)
        engine.backward(loss)
        engine.step()
        losses.append(loss.item())
assert engine.global_steps == 12, engine.global_steps
assert losses[-1] < losses[0], losses
weights = engine.module_state_dict()["0.weight"]
gathered = [torch.empty_like(weights) for _ in range(2)]
dist.all_gather(gathered, weights)
assert torch.equal(gathered[0], gathered[1]), "ranks disagree on the weights"
print(f"rank {dist.get_rank()} ok: loss {losses[0]:.3f} -> {losses[-1]:.3f}", flush=True)
# Tear down in step: gloo sometimes aborts a rank ("terminate called without an active
# exception") when its peer destroys the group, or exits, while it is still tearing down.
del engine, optimizer, loader, scheduler
dist.barrier()
dist.destroy_process_group()
