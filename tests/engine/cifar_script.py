"""A training script shaped like DeepSpeedExamples' ``training/cifar/cifar10_deepspeed.py``.

The yardstick for "a DeepSpeed script runs unchanged": its flags (``--epochs``,
``--local_rank``, ``--log-interval``, ``--dtype``, ``--stage``, the MoE flags it parses),
``add_config_arguments``, ``init_distributed`` first, the rank-0-first barrier dance around
the dataset, the config built as a dict with the example's real keys (``cpu_offload``,
``prescale_gradients``, fp16's ``fp16_master_weights_and_grads`` ...), ``initialize`` with
``args`` and ``training_data``, ``get_accelerator().device_name(local_rank)`` for the device,
``bfloat16_enabled()`` / ``fp16_enabled()`` for the input dtype, and a test pass after
``model_engine.eval()``. Only the imports differ, and the data: a synthetic torchvision-free
CIFAR-shaped set (no network here) and a smaller net.

``--deepspeed_config FILE`` replaces the built-in dict, as ``autotune run -- ...`` and
DeepSpeed's own launcher pass it.
"""

from __future__ import annotations

import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F

import autotune as deepspeed  # was: import deepspeed
from autotune.accelerator import get_accelerator  # was: from deepspeed.accelerator import ...


def add_argument() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="CIFAR")
    parser.add_argument("-e", "--epochs", default=1, type=int, help="number of total epochs")
    parser.add_argument("--local_rank", type=int, default=-1, help="from the launcher")
    parser.add_argument("--log-interval", type=int, default=2, help="log every N batches")
    parser.add_argument("--dtype", default="fp16", type=str, choices=["bf16", "fp16", "fp32"])
    parser.add_argument("--stage", default=0, type=int, choices=[0, 1, 2, 3])
    parser.add_argument("--moe", default=False, action="store_true")
    parser.add_argument("--ep-world-size", default=1, type=int)
    parser.add_argument("--num-experts", type=int, nargs="+", default=[1])
    parser.add_argument("--moe-param-group", default=False, action="store_true")
    parser.add_argument("--num-images", default=64, type=int, help="synthetic training set")
    parser = deepspeed.add_config_arguments(parser)
    return parser.parse_args()


def get_ds_config(args: argparse.Namespace) -> dict:
    return {
        "train_batch_size": 16,
        "steps_per_print": 2000,
        "optimizer": {
            "type": "Adam",
            "params": {"lr": 0.001, "betas": [0.8, 0.999], "eps": 1e-8, "weight_decay": 3e-7},
        },
        "scheduler": {
            "type": "WarmupLR",
            "params": {"warmup_min_lr": 0, "warmup_max_lr": 0.001, "warmup_num_steps": 1000},
        },
        "gradient_clipping": 1.0,
        "prescale_gradients": False,
        "bf16": {"enabled": args.dtype == "bf16"},
        "fp16": {
            "enabled": args.dtype == "fp16",
            "fp16_master_weights_and_grads": False,
            "loss_scale": 0,
            "loss_scale_window": 500,
            "hysteresis": 2,
            "min_loss_scale": 1,
            "initial_scale_power": 15,
        },
        "wall_clock_breakdown": False,
        "zero_optimization": {
            "stage": args.stage,
            "allgather_partitions": True,
            "reduce_scatter": True,
            "allgather_bucket_size": 50000000,
            "reduce_bucket_size": 50000000,
            "overlap_comm": True,
            "contiguous_gradients": True,
            "cpu_offload": False,
        },
    }


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 6, 5)
        self.pool = nn.MaxPool2d(2, 2)
        self.conv2 = nn.Conv2d(6, 16, 5)
        self.fc1 = nn.Linear(16 * 5 * 5, 32)
        self.fc3 = nn.Linear(32, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.pool(F.relu(self.conv1(x)))
        x = self.pool(F.relu(self.conv2(x)))
        x = x.view(-1, 16 * 5 * 5)
        return self.fc3(F.relu(self.fc1(x)))


def cifar_like(num_images: int, seed: int) -> torch.utils.data.Dataset:
    """CIFAR10's shapes and types: float images 3x32x32 in [-1, 1], int64 labels 0-9."""
    gen = torch.Generator().manual_seed(seed)
    images = torch.rand(num_images, 3, 32, 32, generator=gen) * 2 - 1
    labels = torch.randint(0, 10, (num_images,), generator=gen)
    return torch.utils.data.TensorDataset(images, labels)


def test(
    model_engine: torch.nn.Module,
    testset: torch.utils.data.Dataset,
    local_device: str,
    target_dtype: torch.dtype | None,
    test_batch_size: int = 4,
) -> None:
    testloader = torch.utils.data.DataLoader(testset, batch_size=test_batch_size, shuffle=False)
    correct, total = 0, 0
    model_engine.eval()
    with torch.no_grad():
        for images, labels in testloader:
            if target_dtype is not None:
                images = images.to(target_dtype)
            outputs = model_engine(images.to(local_device))
            _, predicted = torch.max(outputs.data, 1)
            total += labels.size(0)
            correct += (predicted == labels.to(local_device)).sum().item()
    if model_engine.local_rank == 0:
        print(f"Accuracy of the network on the {total} test images: {100 * correct / total:.0f} %")


def main(args: argparse.Namespace) -> None:
    torch.set_num_threads(1)
    deepspeed.init_distributed()
    if torch.distributed.get_rank() != 0:
        torch.distributed.barrier()  # the example lets rank 0 download first
    trainset = cifar_like(args.num_images, seed=0)
    testset = cifar_like(8, seed=1)
    if torch.distributed.get_rank() == 0:
        torch.distributed.barrier()

    torch.manual_seed(0)
    net = Net()
    parameters = filter(lambda p: p.requires_grad, net.parameters())
    # DeepSpeed refuses a config both here and in args.deepspeed_config: pass one.
    ds_config = None if args.deepspeed_config else get_ds_config(args)
    model_engine, _optimizer, trainloader, __ = deepspeed.initialize(
        args=args,
        model=net,
        model_parameters=parameters,
        training_data=trainset,
        config=ds_config,
    )
    local_device = get_accelerator().device_name(model_engine.local_rank)
    local_rank = model_engine.local_rank
    target_dtype = None
    if model_engine.bfloat16_enabled():
        target_dtype = torch.bfloat16
    elif model_engine.fp16_enabled():
        target_dtype = torch.half
    print(
        f"rank {model_engine.global_rank}: device={local_device} dtype={target_dtype} "
        f"stage={model_engine.zero_optimization_stage()} "
        f"micro_batch={model_engine.train_micro_batch_size_per_gpu()}",
        flush=True,
    )
    criterion = nn.CrossEntropyLoss()
    for epoch in range(args.epochs):
        running_loss = 0.0
        for i, data in enumerate(trainloader):
            inputs, labels = data[0].to(local_device), data[1].to(local_device)
            if target_dtype is not None:
                inputs = inputs.to(target_dtype)
            outputs = model_engine(inputs)
            loss = criterion(outputs, labels)
            model_engine.backward(loss)
            model_engine.step()
            running_loss += loss.item()
            if local_rank == 0 and i % args.log_interval == (args.log_interval - 1):
                print(f"[{epoch + 1:d}, {i + 1:5d}] loss: {running_loss / args.log_interval:.3f}")
                running_loss = 0.0
    print("Finished Training", flush=True)
    test(model_engine, testset, local_device, target_dtype)


if __name__ == "__main__":
    main(add_argument())
