"""Checkpoint save and load: the engine's sharded checkpoints vs torch's usual DDP checkpoint.

    python experiments/bench_checkpoint.py [--model 27m] [--rounds 3] [--out results/...]

Two gloo ranks on CPU train GPT 27M (AdamW, fp32) for one step, so the optimizer holds its
moments, then save and load a checkpoint, timed barrier to barrier on rank 0:

* engine stage s: ``save_checkpoint`` / ``load_checkpoint`` (every rank writes its shard;
  loading rebuilds nothing but copies into the engine's buffers);
* the torch peer: DDP with ``torch.optim.AdamW``, rank 0 ``torch.save``s the model and
  optimizer state dicts, every rank ``torch.load``s and ``load_state_dict``s them (what
  training scripts without DeepSpeed do).

Rounds interleave the strategies; the table reports medians, bytes written and ratios.
Timings on a shared machine vary, so read the ratios, not the seconds.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

ROOT = Path(__file__).resolve().parents[1]
STRATEGIES = ["engine_s0", "engine_s1", "engine_s2", "engine_s3", "torch_ddp"]


def _config(stage: int) -> dict[str, Any]:
    return {
        "train_micro_batch_size_per_gpu": 2,
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-4}},
        "zero_optimization": {"stage": stage},
    }


def _du(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def _timed(fn: Any) -> float:
    dist.barrier()
    start = time.perf_counter()
    fn()
    dist.barrier()
    return time.perf_counter() - start


def _trial(name: str, model_size: str, folder: Path) -> dict[str, float]:
    import autotune
    from autotune.workloads.gpt import build_gpt

    torch.manual_seed(0)
    workload = build_gpt(model_size)
    batch = workload.make_batch(2, torch.Generator().manual_seed(dist.get_rank()))
    if name.startswith("engine_s"):
        config = _config(int(name[-1]))
        engine, *_ = autotune.initialize(model=workload.model, config=config)
        engine.backward(engine(*batch))
        engine.step()
        save_s = _timed(lambda: engine.save_checkpoint(folder, tag="t"))
        torch.manual_seed(1)
        other, *_ = autotune.initialize(model=build_gpt(model_size).model, config=config)
        load_s = _timed(lambda: other.load_checkpoint(folder, tag="t"))
    else:
        from torch.nn.parallel import DistributedDataParallel as DDP

        model = DDP(workload.model)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
        model(*batch).backward()
        optimizer.step()
        path = folder / "checkpoint.pt"

        def save() -> None:
            if dist.get_rank() == 0:
                folder.mkdir(parents=True, exist_ok=True)
                state = {"model": model.state_dict(), "optimizer": optimizer.state_dict()}
                torch.save(state, path)

        save_s = _timed(save)
        torch.manual_seed(1)
        other_model = DDP(build_gpt(model_size).model)
        other_optimizer = torch.optim.AdamW(other_model.parameters(), lr=1e-4, fused=True)

        def load() -> None:
            state = torch.load(path, map_location="cpu")
            other_model.load_state_dict(state["model"])
            other_optimizer.load_state_dict(state["optimizer"])

        load_s = _timed(load)
    return {"save_s": save_s, "load_s": load_s, "bytes": float(_du(folder))}


def _rank(rank: int, scratch: str, args: argparse.Namespace, out: str) -> None:
    torch.set_num_threads(1)
    init = f"file://{scratch}/init"
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=2)
    rows: dict[str, list[dict[str, float]]] = {name: [] for name in STRATEGIES}
    for round_ in range(args.rounds):
        for name in STRATEGIES:
            folder = Path(scratch) / f"{name}-{round_}"  # shared by the ranks
            rows[name].append(_trial(name, args.model, folder))
            dist.barrier()
    if rank == 0:
        Path(out).write_text(json.dumps(rows))
    dist.destroy_process_group()


def _table(rows: dict[str, list[dict[str, float]]]) -> str:
    def median(name: str, key: str) -> float:
        return statistics.median(r[key] for r in rows[name])

    peer_save, peer_load = median("torch_ddp", "save_s"), median("torch_ddp", "load_s")
    lines = [
        "| strategy | save s | ratio | load s | ratio | MB on disk |",
        "|---|---|---|---|---|---|",
    ]
    for name in STRATEGIES:
        save, load = median(name, "save_s"), median(name, "load_s")
        lines.append(
            f"| {name} | {save:.3f} | {save / peer_save:.2f} | {load:.3f} | "
            f"{load / peer_load:.2f} | {median(name, 'bytes') / 2**20:.0f} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="27m")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", default=str(ROOT / "results" / "bench_checkpoint.json"))
    args = parser.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    with tempfile.TemporaryDirectory() as scratch:
        raw = os.path.join(scratch, "rows.json")
        mp.start_processes(
            _rank,
            args=(scratch, args, raw),
            nprocs=2,
            start_method="spawn",
        )
        rows = json.loads(Path(raw).read_text())
    Path(args.out).write_text(json.dumps(rows, indent=2) + "\n")
    print(_table(rows))


if __name__ == "__main__":
    main()
