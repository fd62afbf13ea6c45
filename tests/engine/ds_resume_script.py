"""A DeepSpeed training script, shaped like DeepSpeedExamples' cifar example, run by torchrun.

Nothing in it is autotune's but the import: argparse with ``add_config_arguments``, the config
from ``args.deepspeed_config``, ``init_distributed``, ``training_data=`` for the loader (fp16
inputs when the config says fp16), ``save_checkpoint`` / ``load_checkpoint`` with a client
state, and the DistributedSampler's epoch set by the script, as DeepSpeed expects.

It trains three ways and checks they agree: uninterrupted; to ``--save_at`` then saved (and,
with ``--kill``, the process killed there); and from the checkpoint on. ``--resume_only``
is the run after a kill; it compares against the losses the killed run wrote.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import signal

import torch

import autotune as deepspeed  # was: import deepspeed


def add_argument() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="tiny regression")
    parser.add_argument("--local_rank", type=int, default=-1)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--save_at", type=int, default=3)
    parser.add_argument("--save_dir", required=True)
    parser.add_argument("--kill", action="store_true", help="kill the process after saving")
    parser.add_argument("--resume_only", action="store_true")
    parser = deepspeed.add_config_arguments(parser)
    return parser.parse_args()


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = torch.nn.Linear(8, 32)
        self.fc2 = torch.nn.Linear(32, 32)
        self.fc3 = torch.nn.Linear(32, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc3(torch.relu(self.fc2(torch.relu(self.fc1(x)))))


def dataset(fp16: bool) -> torch.utils.data.Dataset:
    gen = torch.Generator().manual_seed(0)
    inputs = torch.randn(64, 8, generator=gen)
    targets = inputs.sum(dim=1, keepdim=True).sin()
    return torch.utils.data.TensorDataset(inputs.half() if fp16 else inputs, targets)


def train(args: argparse.Namespace, save: bool, load: bool, seed: int = 0) -> list[float]:
    with open(args.deepspeed_config) as handle:
        fp16 = json.load(handle).get("fp16", {}).get("enabled", False)
    torch.manual_seed(seed)
    net = Net()
    parameters = filter(lambda p: p.requires_grad, net.parameters())
    model_engine, _, trainloader, _ = deepspeed.initialize(
        args=args, model=net, model_parameters=parameters, training_data=dataset(fp16)
    )
    step = 0
    if load:
        _, client_sd = model_engine.load_checkpoint(args.save_dir)
        step = client_sd["step"]
    losses: list[float] = []
    criterion = torch.nn.MSELoss()
    gas = model_engine.gradient_accumulation_steps()
    micro = 0  # micro-batches seen, to skip those a resumed run already trained on
    epoch = 0
    while model_engine.global_steps < args.steps:
        trainloader.sampler.set_epoch(epoch)
        for inputs, labels in trainloader:
            micro += 1
            if micro <= step * gas:
                continue
            inputs, labels = inputs.to(model_engine.device), labels.to(model_engine.device)
            outputs = model_engine(inputs)
            loss = criterion(outputs.float(), labels)
            model_engine.backward(loss)
            model_engine.step()
            losses.append(loss.item())
            at_boundary = model_engine.micro_steps % gas == 0
            if save and at_boundary and model_engine.global_steps == args.save_at:
                model_engine.save_checkpoint(
                    args.save_dir, client_state={"step": model_engine.global_steps}
                )
                if args.kill:
                    os.kill(os.getpid(), signal.SIGKILL)
                return losses
            if model_engine.global_steps == args.steps:
                break
        epoch += 1
    _check_ranks_agree(model_engine)
    return losses


def _check_ranks_agree(model_engine: torch.nn.Module) -> None:
    fc1 = model_engine.module.fc1
    with deepspeed.zero.GatheredParameters(list(fc1.parameters())):  # whole at stage 3 too
        weights = fc1.weight.detach().float().clone()
    gathered = [torch.empty_like(weights) for _ in range(deepspeed.comm.get_world_size())]
    deepspeed.comm.all_gather(gathered, weights)
    assert all(torch.equal(gathered[0], w) for w in gathered), "ranks disagree on the weights"


def main() -> None:
    torch.set_num_threads(1)
    args = add_argument()
    deepspeed.init_distributed()
    rank = deepspeed.comm.get_rank()
    expected_file = os.path.join(args.save_dir, f"expected_rank{rank}.json")
    if args.resume_only:
        with open(expected_file) as handle:
            expected = json.load(handle)
    else:
        expected = train(args, save=False, load=False)
        os.makedirs(args.save_dir, exist_ok=True)
        with open(expected_file, "w") as handle:
            json.dump(expected, handle)
        before = train(args, save=True, load=False)
    resumed = train(args, save=False, load=True, seed=1)
    tail = expected[len(expected) - len(resumed) :]
    assert resumed == tail, f"rank {rank}: resumed {resumed} != uninterrupted {tail}"
    if not args.resume_only:
        assert before + resumed == expected
    print(f"rank {rank} resume ok: {len(resumed)} losses match", flush=True)
    # Tear down in step: an engine still holding the group (in a reference cycle) would
    # destroy it at exit, after the peer has gone, and gloo then aborts the process.
    gc.collect()
    deepspeed.comm.barrier()
    deepspeed.comm.destroy_process_group()


if __name__ == "__main__":
    main()
