"""Published multi-GPU tables (``experiments/published/``) as the cost model sees them.

Two sources of step times: DeepSpeed's autotuning runs (HF models on 16 V100s, a best
throughput and micro-batch per ZeRO stage) and llm-foundry's MPT benchmarks (FSDP FULL_SHARD,
that is ZeRO stage 3, on A100s and H100s). One of memory, held out: per-GPU memory of
Llama-shaped ZeRO and FSDP runs (``llama_memory.json``), planned with ``hf:llama``. Each
step-time row becomes a configuration's counts and its measured step time
(:class:`~autotune.tuner.calibration.CalibrationRow`); a DeepSpeed table is also a ``plan``
request whose ranking and memory can be held against what DeepSpeed measured.

DeepSpeed's models are built on the meta device (their HF shapes); MPT rows are counted from
the published shape (parameters, layers, width), as llm-foundry's own FLOP formula does.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from autotune.tuner.calibration import CalibrationRow
from autotune.tuner.hardware import CATALOG
from autotune.tuner.step_counts import ModelShape, StepShape, Topology, step_counts

PUBLISHED = Path(__file__).resolve().parents[2] / "experiments" / "published"
DEEPSPEED = PUBLISHED / "deepspeed_autotuning_hf.json"
LLM_FOUNDRY = PUBLISHED / "llm_foundry_mpt.json"
LLAMA_MEMORY = PUBLISHED / "llama_memory.json"
# DeepSpeed's defaults in the runs (its config set none of them): buckets of 5e8 elements,
# ZeRO-3's prefetch bucket 5e7 and persistence threshold 1e5, overlap only at stage 3.
DEEPSPEED_BUCKET = 5e8
DEEPSPEED_PREFETCH = 5e7
DEEPSPEED_PERSISTENCE = 1e5


@dataclass(frozen=True)
class DeepSpeedTable:
    """One DeepSpeed autotuning table: per stage, ``(samples/s, micro-batch)``; a
    throughput of 0 is a failed experiment at that micro-batch."""

    name: str
    role: str
    workload: str
    args: Mapping[str, Any]
    precision: str
    stages: Mapping[int, tuple[float, int]]
    max_micro_batch: int | None

    @property
    def best_stage(self) -> int:
        return max(self.stages, key=lambda s: self.stages[s][0])

    def config(self) -> dict[str, Any]:
        """The DeepSpeed config the run tuned (fast mode, DeepSpeed's engine, HF's AdamW)."""
        config: dict[str, Any] = {
            "optimizer": {"type": "AdamW", "params": {"lr": 2e-5}},
            "zero_optimization": {"stage": "all"},
            "autotuning": {"fast": True, "engine": "deepspeed"},
        }
        if self.precision == "fp16":
            config["fp16"] = {"enabled": True}
        if self.max_micro_batch is not None:
            config["autotuning"]["max_train_micro_batch_size_per_gpu"] = self.max_micro_batch
        return config


def deepspeed_tables(role: str | None = None) -> list[DeepSpeedTable]:
    """DeepSpeed's tables (``role``: ``calibration`` or ``held-out``; None: all)."""
    data = json.loads(DEEPSPEED.read_text())
    tables = []
    for name, table in data["tables"].items():
        if role is not None and table["role"] != role:
            continue
        tables.append(
            DeepSpeedTable(
                name=name,
                role=table["role"],
                workload=table["workload"],
                args={**table["args"], "seq_len": table["seq_len"]},
                precision=table["precision"],
                stages={int(s): (float(v[0]), int(v[1])) for s, v in table["stages"].items()},
                max_micro_batch=table.get("max_micro_batch"),
            )
        )
    return tables


@cache
def deepspeed_model(table_name: str) -> Any:
    """The model info of a DeepSpeed table's model, built on meta in its precision, with
    its activations as HF's eager attention of 2021 kept them."""
    import torch

    from autotune.profiling.model_info import model_info_on_meta
    from autotune.workloads import resolve_workload

    table = next(t for t in deepspeed_tables() if t.name == table_name)
    with torch.device("meta"):
        workload = resolve_workload(table.workload, dict(table.args))
    return model_info_on_meta(workload, table.precision)


def deepspeed_rows(table: DeepSpeedTable) -> list[CalibrationRow]:
    """The stages DeepSpeed measured, as calibration rows (16 V100s, one node)."""
    hardware = CATALOG["v100-32gb"]
    topology = Topology(16, 16, table.precision)
    shape = ModelShape.from_info(deepspeed_model(table.name))
    rows = []
    for stage, (throughput, micro) in sorted(table.stages.items()):
        if throughput <= 0:
            continue
        step = deepspeed_step(stage, micro)
        counts = tuple(step_counts(shape, step, topology))
        rows.append(
            CalibrationRow(table.name, hardware, table.precision, counts, 16 * micro / throughput)
        )
    return rows


def deepspeed_step(stage: int, micro_batch_size: int) -> StepShape:
    """A DeepSpeed fast-mode experiment: accumulation 1, DeepSpeed's defaults."""
    return StepShape(
        stage=stage,
        micro_batch_size=micro_batch_size,
        overlap_comm=stage == 3,
        reduce_bucket_size=DEEPSPEED_BUCKET,
        allgather_bucket_size=DEEPSPEED_BUCKET,
        prefetch_bucket_size=DEEPSPEED_PREFETCH,
        param_persistence_threshold=DEEPSPEED_PERSISTENCE,
    )


@dataclass(frozen=True)
class MptRow:
    """One llm-foundry row (see the data file's ``columns``)."""

    table: str
    model: str
    seq_len: int
    gpus: int
    hardware: str
    mfu: float
    micro_batch: int
    grad_accum: int
    tokens_per_s: float
    activation_checkpointing: bool
    num_params: int
    n_layers: int
    d_model: int

    @property
    def samples_per_s(self) -> float:
        return self.tokens_per_s / self.seq_len

    def model_shape(self) -> ModelShape:
        """FSDP's view: one unit (a flat parameter, gathered and reduced whole) per block and
        one for the rest; FLOPs as llm-foundry counts them (``6·N·T + 12·L·d·T²``), the
        recompute a forward of the blocks."""
        n, t, layers, d = self.num_params, self.seq_len, self.n_layers, self.d_model
        block = 12 * layers * d * d
        units = layers + 1
        return ModelShape(
            num_params=n,
            flops_per_sample=6.0 * n * t + 12.0 * layers * d * t * t,
            num_param_tensors=units,
            module_param_counts=(n // units,) * units,
            recompute_flops_per_sample=2.0 * block * t + 4.0 * layers * d * t * t,
        )

    def step(self) -> StepShape:
        units = self.n_layers + 1
        return StepShape(
            stage=3,
            micro_batch_size=self.micro_batch,
            accumulation=self.grad_accum,
            overlap_comm=True,
            reduce_bucket_size=self.num_params / units,
            activation_checkpointing=self.activation_checkpointing,
            param_persistence_threshold=0,
        )

    def calibration_row(self) -> CalibrationRow:
        topology = Topology(self.gpus, 8, "bf16")
        counts = tuple(step_counts(self.model_shape(), self.step(), topology))
        samples = self.gpus * self.micro_batch * self.grad_accum
        return CalibrationRow(
            self.table, CATALOG[self.hardware], "bf16", counts, samples / self.samples_per_s
        )


def mpt_rows(role: str | None = None) -> Iterator[MptRow]:
    """llm-foundry's rows, those with activations offloaded to the CPU left out (the cost
    model has no such term)."""
    data = json.loads(LLM_FOUNDRY.read_text())
    columns = data["row_columns"]
    shapes = data["shapes"]["sizes"]
    for name, table in data["tables"].items():
        if role is not None and table["role"] != role:
            continue
        for values in table["rows"]:
            row = dict(zip(columns, values, strict=True))
            if row["activation_cpu_offload"]:
                continue
            layers, width = shapes[row["model"]]
            yield MptRow(
                table=name,
                model=row["model"],
                seq_len=row["seq_len"],
                gpus=row["gpus"],
                hardware=row["hardware"],
                mfu=row["mfu"],
                micro_batch=row["micro_batch"],
                grad_accum=row["grad_accum"],
                tokens_per_s=float(row["tokens_per_s"]),
                activation_checkpointing=row["activation_checkpointing"],
                num_params=row["num_params"],
                n_layers=layers,
                d_model=width,
            )


def calibration_rows() -> list[CalibrationRow]:
    """Every row the cost model is calibrated on."""
    rows = [row for table in deepspeed_tables("calibration") for row in deepspeed_rows(table)]
    return rows + [row.calibration_row() for row in mpt_rows("calibration")]


@dataclass(frozen=True)
class LlamaMemoryRow:
    """One published Llama run's memory per GPU (see ``llama_memory.json``'s ``columns``)."""

    source: str
    model: str
    zero_stage: int
    shards: int
    hardware: str
    micro_batch: int
    grad_accum: int
    seq_len: int
    activation_checkpointing: bool
    engine: str
    memory_gib: float | None
    fits: bool

    def config(self) -> dict[str, Any]:
        """The run as a config ``autotune plan`` reads: bf16, its stage, micro-batch,
        accumulation and checkpointing; DeepSpeed's engine where it ran on DeepSpeed (its
        buckets are allocated whole), else the built-in one."""
        return {
            "bf16": {"enabled": True},
            "zero_optimization": {"stage": self.zero_stage},
            "train_micro_batch_size_per_gpu": [self.micro_batch],
            "gradient_accumulation_steps": self.grad_accum,
            "activation_checkpointing": {"enabled": self.activation_checkpointing},
            "autotuning": {"engine": "deepspeed" if self.engine == "deepspeed" else "builtin"},
        }


def llama_memory_rows() -> list[LlamaMemoryRow]:
    """Every published Llama memory row (all held out)."""
    data = json.loads(LLAMA_MEMORY.read_text())
    columns = data["row_columns"]
    return [LlamaMemoryRow(**dict(zip(columns, values, strict=True))) for values in data["rows"]]


def llama_sources() -> dict[str, dict[str, str]]:
    """Where each source's rows come from (``url``, ``title``, ``setting``, ``memory``)."""
    sources: dict[str, dict[str, str]] = json.loads(LLAMA_MEMORY.read_text())["sources"]
    return sources


@cache
def llama_model(model: str, seq_len: int) -> Any:
    """The model info of ``hf:llama`` in a row's shape, built on meta in bf16 with SDPA
    attention, its checkpointed activations measured too."""
    import torch

    from autotune.profiling.model_info import model_info_on_meta
    from autotune.workloads import resolve_workload

    shape = json.loads(LLAMA_MEMORY.read_text())["shapes"][model]
    args = {
        **shape,
        "seq_len": seq_len,
        "max_position_embeddings": seq_len,
        "attn_implementation": "sdpa",
    }
    with torch.device("meta"):
        workload = resolve_workload("hf:llama", args)
    return model_info_on_meta(workload, "bf16", workload.activation_checkpointing)
