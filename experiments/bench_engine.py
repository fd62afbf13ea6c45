"""Benchmark: the built-in ZeRO engine against torch's and DeepSpeed's data parallelism.

One invocation trains the same GPT-style model (the ``27m`` size of the built-in ``gpt``
workload: 6 layers, d_model 512, 8 heads, seq 128, vocab 8192; micro-batch 4, AdamW, fp32) at
world size 2 over gloo on CPU, one torch thread per rank, with

    engine stage 0  vs  torch DDP
    engine stage 1  vs  torch ZeroRedundancyOptimizer (+ DDP)
    engine stage 2  vs  FSDP (v1) ShardingStrategy.SHARD_GRAD_OP
    engine stage 3  vs  FSDP2 without resharding (both keep a forward's gathered parameters
                        for backward: DeepSpeed's default stage3_max_reuse_distance does)
    engine stage 3 with stage3_max_reuse_distance 0  vs  FSDP2 fully_shard (both release after
                        each use and gather again)
    engine stage s  vs  DeepSpeed stage s (s = 1..3), when its venv exists

and prints median step time and peak memory per rank side by side, as ratios.

How it measures, and why:

* The machine is noisy (±50% run to run, more while other jobs share its two cores), so
  strategies are interleaved: each round runs every strategy once, in the same order, and
  medians are taken over all rounds. Ratios are of medians. The fastest step (``min``) and CPU
  seconds per step are recorded too: other load inflates both far less than the median.
* Step time is the wall time of forward + backward + optimizer step, the slowest rank's per
  step, after a barrier. CPU time is the rank process's (all its threads), mean over ranks.
* Every trial runs in two fresh rank processes, so peak memory is the strategy's own: peak RSS
  per rank (VmHWM from /proc, reset once torch is imported), for everyone, plus the engine's
  own accounted peak for ours. Sharding only shows at a larger size, so a memory section runs
  each strategy once more at 168M parameters (12 layers, d_model 1024).
* DeepSpeed is a benchmark peer, never a dependency: it runs from its own venv
  (``.venv-deepspeed`` at the repository root, or ``--deepspeed-python``) with
  ``DS_ACCELERATOR=cpu``; without it those rows are skipped with a note.
* Our engine and DeepSpeed get the same ds_config (``ds_config`` below); torch's peers run with
  their defaults. Both optimizers are fused: torch's ``fused=True`` AdamW for ours, DeepSpeed's
  own CPU FusedAdam for it.

A trial is run by a subprocess (``--serve KIND``, with the python of the strategy's venv) that
starts two gloo ranks and answers one JSON command on stdin with one JSON line.

Usage::

    python experiments/bench_engine.py                    # timing at 27M, then memory at 168M
    python experiments/bench_engine.py --quick            # a short run of both
    python experiments/bench_engine.py --section time --rounds 6 --only engine_s3 fsdp2

Writes raw figures to ``results/bench_engine.json`` and a table to ``results/bench_engine.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "results"
DEFAULT_DS_PYTHON = ROOT / ".venv-deepspeed" / "bin" / "python"
# Where and how wide it runs. The orchestrator sets these from its flags and hands them to
# the rank processes it starts through the environment.
DEVICE = os.environ.get("BENCH_ENGINE_DEVICE", "cpu")  # "cpu" (gloo) or "cuda" (NCCL)
WORLD_SIZE = int(os.environ.get("BENCH_ENGINE_WORLD_SIZE", "2"))
MICRO_BATCH = int(os.environ.get("BENCH_ENGINE_MICRO_BATCH", "4"))
LR = 1e-4

# The two model sizes: the timing model, and the one where memory sharding shows.
MODELS: dict[str, dict[str, Any]] = {
    "27m": {"size": "27m"},
    "168m": {"size": "27m", "n_layer": 12, "d_model": 1024, "n_head": 16},
}


@dataclass(frozen=True)
class Strategy:
    name: str
    pool: str  # "torch" or "deepspeed": which venv runs it
    label: str


STRATEGIES = {
    s.name: s
    for s in [
        Strategy("engine_s0", "torch", "engine stage 0"),
        Strategy("ddp", "torch", "torch DDP"),
        Strategy("engine_s1", "torch", "engine stage 1"),
        Strategy("zero_redundancy", "torch", "ZeroRedundancyOptimizer"),
        Strategy("engine_s2", "torch", "engine stage 2"),
        Strategy("fsdp_grad_op", "torch", "FSDP SHARD_GRAD_OP"),
        Strategy("engine_s3", "torch", "engine stage 3"),
        Strategy("engine_s3_release", "torch", "engine stage 3, reuse distance 0"),
        Strategy("fsdp2", "torch", "FSDP2 fully_shard"),
        Strategy("fsdp2_no_reshard", "torch", "FSDP2 no reshard"),
        Strategy("deepspeed_s1", "deepspeed", "DeepSpeed stage 1"),
        Strategy("deepspeed_s2", "deepspeed", "DeepSpeed stage 2"),
        Strategy("deepspeed_s3", "deepspeed", "DeepSpeed stage 3"),
    ]
}

# (row label, ours, torch peer, DeepSpeed peer)
PAIRS = [
    ("stage 0", "engine_s0", "ddp", None),
    ("stage 1", "engine_s1", "zero_redundancy", "deepspeed_s1"),
    ("stage 2", "engine_s2", "fsdp_grad_op", "deepspeed_s2"),
    # Like with like. By default (stage3_max_reuse_distance 1e9, DeepSpeed's) a unit gathered
    # in forward stays gathered for backward, as FSDP2 without resharding does; with reuse
    # distance 0 it is released after each use and gathered again, as FSDP2 fully_shard does.
    ("stage 3", "engine_s3", "fsdp2_no_reshard", "deepspeed_s3"),
    ("stage 3 released", "engine_s3_release", "fsdp2", None),
]

# Engine strategies that differ from their stage's defaults.
ENGINE_KNOBS: dict[str, dict[str, Any]] = {"engine_s3_release": {"stage3_max_reuse_distance": 0}}


# The ZeRO knobs both our engine and DeepSpeed train with (the rest are DeepSpeed's defaults):
# buckets of 5M elements, reduced during backward, as DDP's 25 MB buckets are.
ZERO_KNOBS: dict[str, Any] = {
    "overlap_comm": True,
    "reduce_bucket_size": 5_000_000,
    "allgather_bucket_size": 5_000_000,
}


def ds_config(stage: int, extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """The config both our engine and DeepSpeed train with."""
    return {
        "train_micro_batch_size_per_gpu": MICRO_BATCH,
        "gradient_accumulation_steps": 1,
        "optimizer": {"type": "AdamW", "params": {"lr": LR}},
        "zero_optimization": {"stage": stage, **ZERO_KNOBS, **(extra or {})},
    }


# --- inside a rank -------------------------------------------------------------------------


def _rss_bytes(field: str) -> int:
    with open("/proc/self/status") as status:
        match = re.search(rf"^{field}:\s+(\d+) kB", status.read(), re.MULTILINE)
    assert match is not None
    return int(match.group(1)) * 1024


def _reset_peak_rss() -> None:
    # Writing 5 resets VmHWM to the current RSS (Linux >= 4.0).
    with open("/proc/self/clear_refs", "w") as clear:
        clear.write("5")


def _build_model(model: str) -> Any:
    import torch

    from autotune.workloads.gpt import build_gpt

    torch.manual_seed(0)
    return build_gpt(**MODELS[model])


def _peak() -> str:
    """The memory a trial is judged by: peak RSS on CPU, the allocator's peak on CUDA."""
    return "peak_cuda_bytes" if DEVICE == "cuda" else "peak_rss_bytes"


def _peak_label() -> str:
    return "CUDA allocator peak" if DEVICE == "cuda" else "peak RSS"


def _device() -> Any:
    import torch

    return (
        torch.device("cuda", torch.cuda.current_device())
        if DEVICE == "cuda"
        else torch.device("cpu")
    )


def _sync() -> None:
    """Wait for the GPU: a step's time is its kernels', not their launches'."""
    if DEVICE == "cuda":
        import torch

        torch.cuda.synchronize()


def _wrap(name: str, model: Any, group: Any) -> tuple[Any, Any]:
    """``(step_fn, engine_or_None)``: ``step_fn(inputs)`` runs one training step."""
    import torch

    if name.startswith("engine_s"):
        import autotune

        engine, _, _, _ = autotune.initialize(
            model=model,
            config=ds_config(int(name[len("engine_s")]), ENGINE_KNOBS.get(name)),
            process_group=group,
        )

        def engine_step(inputs: tuple[Any, ...]) -> None:
            loss = engine(*inputs)
            engine.backward(loss)
            engine.step()

        return engine_step, engine
    if name.startswith("deepspeed_s"):
        import deepspeed

        engine, _, _, _ = deepspeed.initialize(
            model=model, model_parameters=model.parameters(), config=ds_config(int(name[-1]))
        )

        def ds_step(inputs: tuple[Any, ...]) -> None:
            loss = engine(*inputs)
            engine.backward(loss)
            engine.step()

        base = getattr(engine.optimizer, "optimizer", engine.optimizer)
        print(f"deepspeed_s{name[-1]}: optimizer {type(base).__module__}.{type(base).__name__}")
        return ds_step, None

    from torch.nn.parallel import DistributedDataParallel as DDP

    from autotune.workloads.gpt import Block

    model.to(_device())
    # On CUDA, DDP needs the rank's device; on CPU none may be given.
    device_ids = [_device()] if DEVICE == "cuda" else None
    if name == "ddp":
        wrapped = DDP(model, process_group=group, device_ids=device_ids)
        optimizer = torch.optim.AdamW(wrapped.parameters(), lr=LR)
    elif name == "zero_redundancy":
        from torch.distributed.optim import ZeroRedundancyOptimizer

        wrapped = DDP(model, process_group=group, device_ids=device_ids)
        optimizer = ZeroRedundancyOptimizer(
            wrapped.parameters(), optimizer_class=torch.optim.AdamW, lr=LR, process_group=group
        )
    elif name == "fsdp_grad_op":
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
        from torch.distributed.fsdp import ShardingStrategy
        from torch.distributed.fsdp.wrap import ModuleWrapPolicy

        wrapped = FSDP(
            model,
            process_group=group,
            sharding_strategy=ShardingStrategy.SHARD_GRAD_OP,
            auto_wrap_policy=ModuleWrapPolicy({Block}),
            device_id=_device(),
        )
        optimizer = torch.optim.AdamW(wrapped.parameters(), lr=LR)
    elif name in ("fsdp2", "fsdp2_no_reshard"):
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        mesh = init_device_mesh(DEVICE, (WORLD_SIZE,))
        reshard = name == "fsdp2"
        for block in model.blocks:
            fully_shard(block, mesh=mesh, reshard_after_forward=reshard)
        fully_shard(model, mesh=mesh, reshard_after_forward=reshard)
        wrapped = model
        optimizer = torch.optim.AdamW(wrapped.parameters(), lr=LR)
    else:
        raise ValueError(f"unknown strategy {name!r}")

    def torch_step(inputs: tuple[Any, ...]) -> None:
        loss = wrapped(*inputs)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return torch_step, None


def run_trial(name: str, model: str, steps: int, warmup: int, profile: str | None) -> dict:
    """Train ``name`` for ``warmup + steps`` steps on this rank; times and memory."""
    import gc

    import torch
    import torch.distributed as dist

    from autotune.workloads.gpt import build_gpt

    gc.collect()
    if DEVICE == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    _reset_peak_rss()
    rss_start = _rss_bytes("VmRSS")
    group = dist.group.WORLD
    rank = dist.get_rank()
    workload = _build_model(model)
    step, engine = _wrap(name, workload.model, group)
    del build_gpt
    generator = torch.Generator(device=_device()).manual_seed(1000 + rank)
    batches = [workload.make_batch(MICRO_BATCH, generator) for _ in range(4)]
    times: list[float] = []
    cpu_times: list[float] = []
    for index in range(warmup + steps):
        if profile is not None and index == warmup:
            profiler = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU])
            profiler.__enter__()
        _sync()
        dist.barrier(group)
        start, cpu_start = time.perf_counter(), time.process_time()
        step(batches[index % len(batches)])
        _sync()
        if index >= warmup:
            times.append(time.perf_counter() - start)
            cpu_times.append(time.process_time() - cpu_start)
    if profile is not None and steps > 0:
        profiler.__exit__(None, None, None)
        table = profiler.key_averages().table(sort_by="self_cpu_time_total", row_limit=40)
        Path(f"{profile}.rank{rank}.txt").write_text(table)
        profiler.export_chrome_trace(f"{profile}.rank{rank}.json")
    dist.barrier(group)
    result = {
        "times_s": times,
        "cpu_s": cpu_times,
        "peak_rss_bytes": _rss_bytes("VmHWM"),
        "peak_cuda_bytes": torch.cuda.max_memory_allocated() if DEVICE == "cuda" else None,
        "start_rss_bytes": rss_start,
        "engine_peak_bytes": engine.peak_memory_bytes() if engine is not None else None,
    }
    del step, engine, workload, batches
    gc.collect()
    return result


def _rank_main(rank: int, init_file: str, pool: str, tasks: Any, results: Any) -> None:
    import traceback

    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        os.environ.pop(key, None)
    backend = "nccl" if DEVICE == "cuda" else "gloo"
    if DEVICE == "cuda":
        torch.cuda.set_device(rank)  # before NCCL binds its communicator to a GPU
    dist.init_process_group(
        backend, init_method=f"file://{init_file}", rank=rank, world_size=WORLD_SIZE
    )
    if pool == "deepspeed":
        import deepspeed

        os.environ.update(RANK=str(rank), WORLD_SIZE=str(WORLD_SIZE), LOCAL_RANK=str(rank))
        deepspeed.init_distributed(dist_backend=backend)
    while (task := tasks.get()) is not None:
        try:
            results.put((rank, True, run_trial(**task)))
        except BaseException:  # sent back and reported by the orchestrator
            results.put((rank, False, traceback.format_exc()))
    dist.destroy_process_group()


def serve(pool: str) -> None:
    """Run two ranks; answer each JSON command on stdin with one JSON line of results."""
    import multiprocessing as mp

    # Peers (DeepSpeed above all) print to stdout: keep the real stdout for answers only.
    answers = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    if pool == "deepspeed" and DEVICE == "cpu":
        os.environ["DS_ACCELERATOR"] = "cpu"
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29533" if pool == "deepspeed" else "29531")
    ctx = mp.get_context("spawn")
    with tempfile.TemporaryDirectory() as tmp:
        tasks = [ctx.Queue() for _ in range(WORLD_SIZE)]
        results = ctx.Queue()
        procs = [
            ctx.Process(
                target=_rank_main,
                args=(r, os.path.join(tmp, "init"), pool, tasks[r], results),
                daemon=True,
            )
            for r in range(WORLD_SIZE)
        ]
        for proc in procs:
            proc.start()
        for line in sys.stdin:
            command = json.loads(line)
            for queue in tasks:
                queue.put(command)
            out: dict[int, Any] = {}
            while len(out) < WORLD_SIZE:
                rank, ok, value = results.get()
                out[rank] = value if ok else {"error": value}
            answers.write(json.dumps([out[r] for r in range(WORLD_SIZE)]) + "\n")
            answers.flush()
        for queue in tasks:
            queue.put(None)
        for proc in procs:
            proc.join(timeout=30)


# --- the orchestrator ----------------------------------------------------------------------


class Pool:
    """A ``--serve`` subprocess: two ranks of one venv's python."""

    def __init__(self, kind: str, python: str) -> None:
        # Prepended: packages carried to a GPU machine come by PYTHONPATH too.
        path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
        env = dict(os.environ, PYTHONPATH=path, OMP_NUM_THREADS="1")
        if kind == "deepspeed" and "TORCH_CUDA_ARCH_LIST" in env:
            # DeepSpeed's JIT build of its fused Adam reads "9.0a" (torch's spelling for
            # Hopper's own instructions) as a number and fails; it needs none of them.
            arches = re.sub(r"(\d+\.\d+)[a-z]+", r"\1", env["TORCH_CUDA_ARCH_LIST"])
            env["TORCH_CUDA_ARCH_LIST"] = arches
        # DeepSpeed logs a great deal: to a file, named in the error if its pool dies.
        self.log = Path(tempfile.gettempdir()) / f"bench_engine_{kind}_{os.getpid()}.log"
        self.proc = subprocess.Popen(
            [python, str(Path(__file__).resolve()), "--serve", kind],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.log.open("w") if kind == "deepspeed" else None,
            text=True,
            env=env,
            cwd=ROOT,
        )

    def run(self, **command: Any) -> list[dict]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps(command) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"a rank pool died (see its stderr, or {self.log})")
        ranks = json.loads(line)
        for rank in ranks:
            if "error" in rank:
                raise RuntimeError(rank["error"])
        return ranks

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        self.proc.wait(timeout=60)


def _merge(ranks: list[dict]) -> dict:
    """One trial's figures: the slowest rank's time per step, memory per rank."""
    return {
        "times_s": [max(ts) for ts in zip(*(r["times_s"] for r in ranks), strict=True)],
        # CPU seconds (all threads of the process) per step, averaged over ranks: the work
        # done, which other load on the machine inflates far less than wall time.
        "cpu_s": [statistics.mean(cs) for cs in zip(*(r["cpu_s"] for r in ranks), strict=True)],
        "peak_rss_bytes": [r["peak_rss_bytes"] for r in ranks],
        "peak_cuda_bytes": [r["peak_cuda_bytes"] for r in ranks],
        "engine_peak_bytes": [r["engine_peak_bytes"] for r in ranks],
    }


def _summary(trials: list[dict]) -> dict:
    times = [t for trial in trials for t in trial["times_s"]]
    rss = max(b for trial in trials for b in trial["peak_rss_bytes"])
    cuda = [b for trial in trials for b in trial.get("peak_cuda_bytes", []) if b is not None]
    engine = [b for trial in trials for b in trial["engine_peak_bytes"] if b is not None]
    return {
        "median_step_s": statistics.median(times),
        "min_step_s": min(times),
        "median_cpu_s": statistics.median(c for trial in trials for c in trial["cpu_s"]),
        "round_medians_s": [statistics.median(trial["times_s"]) for trial in trials],
        "peak_rss_bytes": rss,
        "peak_cuda_bytes": max(cuda) if cuda else None,
        "engine_peak_bytes": max(engine) if engine else None,
        "trials": trials,
    }


def run_fresh(name: str, model: str, steps: int, warmup: int, **extra: Any) -> dict | None:
    """One trial of ``name`` in two fresh rank processes (``None`` without its venv).

    Fresh processes make peak RSS that strategy's own: a warm process keeps the heap that
    earlier trials grew.
    """
    strategy = STRATEGIES[name]
    python = sys.executable if strategy.pool == "torch" else extra.pop("ds_python", None)
    extra.pop("ds_python", None)
    if python is None:
        return None
    pool = Pool(strategy.pool, str(python))
    try:
        ranks = pool.run(name=name, model=model, steps=steps, warmup=warmup, **extra)
    finally:
        pool.close()
    return _merge(ranks)


def time_section(
    names: list[str],
    rounds: int,
    steps: int,
    warmup: int,
    ds_python: Path | None,
    profile: Path | None = None,
) -> dict:
    """Interleaved rounds at 27M: every strategy once per round, in the same order."""
    trials: dict[str, list[dict]] = {n: [] for n in names}
    for round_ in range(rounds):
        for name in names:
            # Profiles (torch.profiler tables and traces) of the first round only.
            where = str(profile / name) if profile is not None and round_ == 0 else None
            trial = run_fresh(name, "27m", steps, warmup, profile=where, ds_python=ds_python)
            if trial is None:
                continue
            trials[name].append(trial)
            print(
                f"  round {round_ + 1}/{rounds} {name:18s} "
                f"{statistics.median(trial['times_s']):.3f} s/step "
                f"(CPU {statistics.median(trial['cpu_s']):.3f} s), "
                f"{_peak_label()} {max(trial[_peak()]) / 2**30:.2f} GiB",
                flush=True,
            )
    return {n: _summary(t) for n, t in trials.items() if t}


def memory_section(names: list[str], steps: int, ds_python: Path | None) -> dict:
    """Each strategy in fresh processes at 168M, for its peak RSS."""
    out = {}
    for name in names:
        trial = run_fresh(name, "168m", steps, 1, profile=None, ds_python=ds_python)
        if trial is None:
            continue
        out[name] = _summary([trial])
        print(
            f"  {name:18s} {_peak_label()} {out[name][_peak()] / 2**30:.2f} GiB/rank, "
            f"{out[name]['median_step_s']:.2f} s/step",
            flush=True,
        )
    return out


def _gib(nbytes: int | None) -> str:
    return "-" if nbytes is None else f"{nbytes / 2**30:.2f}"


def _ratio(a: float | None, b: float | None) -> str:
    return "-" if a is None or b is None else f"{a / b:.2f}"


def tables(result: dict) -> str:
    """The markdown tables of a result, and the targets met or missed."""
    lines: list[str] = []
    timing = result.get("time", {})

    def get(name: str | None, key: str) -> float | None:
        figures = timing.get(name) if name else None
        return None if figures is None else figures[key]

    if timing:
        lines += [
            "### Step time at 27M parameters: median s/step (ratio = ours / peer)",
            "",
            "| stage | engine | torch peer | peer | ratio | DeepSpeed | ratio |",
            "|---|---|---|---|---|---|---|",
        ]
        for label, ours, peer, ds in PAIRS:
            o, p, d = (get(n, "median_step_s") for n in (ours, peer, ds))
            lines.append(
                f"| {label} | {_f(o)} | {STRATEGIES[peer].label} | {_f(p)} | {_ratio(o, p)} "
                f"| {_f(d)} | {_ratio(o, d)} |"
            )
        lines += [
            "",
            "### Less sensitive to other load: fastest step, and CPU s/step (all threads)",
            "",
            "| stage | engine min | peer min | ratio | DS min | ratio "
            "| engine CPU | peer CPU | ratio | DS CPU | ratio |",
            "|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        for label, ours, peer, ds in PAIRS:
            o, p, d = (get(n, "min_step_s") for n in (ours, peer, ds))
            oc, pc, dc = (get(n, "median_cpu_s") for n in (ours, peer, ds))
            lines.append(
                f"| {label} | {_f(o)} | {_f(p)} | {_ratio(o, p)} | {_f(d)} | {_ratio(o, d)} "
                f"| {_f(oc)} | {_f(pc)} | {_ratio(oc, pc)} | {_f(dc)} | {_ratio(oc, dc)} |"
            )
        lines += [
            "",
            f"### Peak memory per rank at 27M parameters (GiB, {_peak_label()})",
            "",
            "| stage | engine | engine's own report | torch peer | DeepSpeed |",
            "|---|---|---|---|---|",
        ]
        for label, ours, peer, ds in PAIRS:
            lines.append(
                f"| {label} | {_gib(get(ours, _peak()))} "
                f"| {_gib(get(ours, 'engine_peak_bytes'))} | {_gib(get(peer, _peak()))} "
                f"| {_gib(get(ds, _peak()))} |"
            )
        lines += ["", "### Targets (medians)", ""]
        for label, ours, peer, ds in PAIRS:
            o, p, d = (get(n, "median_step_s") for n in (ours, peer, ds))
            limit = 0.90 if label.startswith("stage 3") else 1.00
            if o is not None and p is not None:
                met = "met" if o / p <= limit else "MISSED"
                lines.append(
                    f"- {label} ≤ {limit:.2f} × {STRATEGIES[peer].label}: {o / p:.2f}, {met}"
                )
            if o is not None and d is not None:
                met = "met" if o < d else "MISSED"
                lines.append(f"- {label} faster than DeepSpeed: {o / d:.2f}, {met}")
        lines.append("")
    memory = result.get("memory", {})
    if memory:
        lines += [
            "### Peak memory per rank at 168M parameters (fresh processes)",
            "",
            f"| strategy | {_peak_label()} GiB | engine's own report GiB | s/step |",
            "|---|---|---|---|",
        ]
        for name, figures in memory.items():
            lines.append(
                f"| {STRATEGIES[name].label} | {_gib(figures.get(_peak()))} "
                f"| {_gib(figures['engine_peak_bytes'])} | {figures['median_step_s']:.2f} |"
            )
        lines.append("")
    return "\n".join(lines)


def _f(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def _configure(device: str, world_size: int, micro_batch: int) -> None:
    """Set where the benchmark runs, here and (through the environment) in its rank pools."""
    global DEVICE, WORLD_SIZE, MICRO_BATCH
    import torch

    if device == "cuda" and torch.cuda.device_count() < world_size:
        raise SystemExit(
            f"--world-size {world_size} on CUDA needs {world_size} GPUs; "
            f"{torch.cuda.device_count()} visible"
        )
    DEVICE, WORLD_SIZE, MICRO_BATCH = device, world_size, micro_batch
    os.environ.update(
        BENCH_ENGINE_DEVICE=device,
        BENCH_ENGINE_WORLD_SIZE=str(world_size),
        BENCH_ENGINE_MICRO_BATCH=str(micro_batch),
    )


def _device_name() -> str:
    import torch

    if DEVICE == "cuda":
        return f"{torch.cuda.device_count()} x {torch.cuda.get_device_name(0)}"
    return f"{platform.machine()} CPU"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--serve", choices=["torch", "deepspeed"], help=argparse.SUPPRESS)
    parser.add_argument("--quick", action="store_true", help="a short run (2 rounds, 3 steps)")
    parser.add_argument("--section", choices=["time", "memory", "all"], default="all")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--steps", type=int, default=5, help="measured steps per trial")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--memory-steps", type=int, default=2)
    parser.add_argument(
        "--only", nargs="*", choices=list(STRATEGIES), help="strategies to run (default: all)"
    )
    parser.add_argument(
        "--device", choices=["cpu", "cuda"], default=DEVICE, help="cpu: gloo; cuda: NCCL"
    )
    parser.add_argument(
        "--world-size", type=int, help="ranks (default: 2 on CPU, 1 on CUDA: one per GPU)"
    )
    parser.add_argument("--micro-batch", type=int, default=MICRO_BATCH)
    parser.add_argument("--deepspeed-python", type=Path, default=DEFAULT_DS_PYTHON)
    parser.add_argument(
        "--output",
        type=Path,
        help="where the .json and .md go (default: results/bench_engine, "
        "results/gpu/bench_engine_cuda on CUDA)",
    )
    parser.add_argument(
        "--profile", type=Path, help="write torch.profiler tables and traces of round 1 here"
    )
    args = parser.parse_args()
    if args.serve:
        serve(args.serve)
        return
    if args.quick:
        args.rounds, args.steps, args.warmup, args.memory_steps = 2, 3, 1, 1
    _configure(args.device, args.world_size or (2 if args.device == "cpu" else 1), args.micro_batch)
    if args.output is None:
        cuda = args.device == "cuda"
        args.output = RESULTS / "gpu" / "bench_engine_cuda" if cuda else RESULTS / "bench_engine"
    names = args.only or list(STRATEGIES)
    ds_python: Path | None = args.deepspeed_python
    notes = []
    if ds_python is None or not ds_python.exists():
        notes.append(
            f"DeepSpeed skipped: no python at {ds_python} (make a separate venv there with "
            "torch==2.13.0 and deepspeed)"
        )
        print(notes[-1])
        ds_python = None
    import torch

    result: dict[str, Any] = {
        "machine": {
            "platform": platform.platform(),
            "cpus": os.cpu_count(),
            "torch": torch.__version__,
            "python": platform.python_version(),
        },
        "settings": {
            "world_size": WORLD_SIZE,
            "device": _device_name(),
            "backend": "nccl" if DEVICE == "cuda" else "gloo",
            "threads_per_rank": 1,
            "micro_batch": MICRO_BATCH,
            "rounds": args.rounds,
            "steps": args.steps,
            "warmup": args.warmup,
            "memory_steps": args.memory_steps,
            "config": ds_config(0),
        },
        "notes": notes,
    }
    start = time.time()
    if args.section in ("time", "all"):
        print(f"timing at 27M: {args.rounds} interleaved rounds of {args.steps} steps")
        if args.profile is not None:
            args.profile.mkdir(parents=True, exist_ok=True)
        result["time"] = time_section(
            names, args.rounds, args.steps, args.warmup, ds_python, args.profile
        )
    if args.section in ("memory", "all"):
        print("memory at 168M: fresh processes per strategy")
        result["memory"] = memory_section(names, args.memory_steps, ds_python)
    result["wall_s"] = time.time() - start
    print()
    print(tables(result))
    for note in notes:
        print(note)
    # One section at a time keeps each invocation short: merge it with the other's figures.
    path = args.output.with_suffix(".json")
    if args.section != "all" and path.exists():
        previous = json.loads(path.read_text())
        other = "memory" if args.section == "time" else "time"
        if other in previous:
            result[other] = previous[other]
            result[f"{other}_settings"] = previous.get(f"{other}_settings", previous["settings"])
    result[f"{args.section}_settings"] = result["settings"]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=1) + "\n")
    timing = result.get("time_settings", result["settings"])
    where = (
        f"NCCL, {_device_name()}"
        if DEVICE == "cuda"
        else f"gloo, {platform.machine()} CPU ({os.cpu_count()} cores, shared with other jobs)"
    )
    header = (
        f"# Engine benchmark\n\nWorld size {WORLD_SIZE}, {where}, micro-batch {MICRO_BATCH}, "
        f"one torch thread per rank, torch "
        f"{torch.__version__}. Timing: {timing['rounds']} interleaved rounds of "
        f"{timing['steps']} steps after {timing['warmup']} warm-up, each trial in fresh "
        f"processes. `python experiments/bench_engine.py`.\n\n"
    )
    args.output.with_suffix(".md").write_text(
        header + tables(result) + "".join(f"\n{n}\n" for n in notes)
    )


if __name__ == "__main__":
    main()
