"""Landscapes shaped like a GPU's, simulated, for replaying tuners where no GPU is at hand.

A measured CPU landscape is flat (the top few configurations within noise): every tuner is
"right" by its second experiment. A GPU's is not: small micro-batches leave the tensor cores
idle, stages 2-3 pay for their collectives, memory ends where the model's states and
activations fill the device. :func:`simulated_landscape` builds such a table, in the format
``experiments/landscape.py`` writes (so :class:`~autotune.bench.table.TableRunner` replays
it), from the cost model with constants the tuner does not know:

- each constant is its datasheet value times ``e^N(0, 0.4²)`` (the machine is not its
  datasheet), and each ZeRO stage runs another ``e^N(0, 0.04²)`` off the model (what the model
  leaves out), seeded;
- the memory a configuration needs is the estimate times ``e^N(0, 0.08²)`` per stage, and
  the last 5% of the device cost a stage 4% more (the allocator's retries near the edge);
- each measurement varies by ``noise`` (1.5%: a GPU's run-to-run noise), the table's median
  being the configuration's true value.

The tuner under test starts from the datasheet's constants and the same memory estimate:
it has to learn what differs.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import Any

import numpy as np

from autotune.bench.table import LANDSCAPE_FORMAT
from autotune.config import load_config
from autotune.profiling.model_info import ModelInfo
from autotune.tuner.cost_model import CostModel, ModelShape, Topology, prior_for, step_counts
from autotune.tuner.hardware import CATALOG
from autotune.tuner.memory import estimate_memory
from autotune.tuner.model_search import step_shape
from autotune.tuner.space import build_space

CONSTANT_SPREAD = 0.4
STAGE_SPREAD = 0.04
MEMORY_SPREAD = 0.08
EDGE_SHARE = 0.05
EDGE_SLOWDOWN = 1.04
# The repeats of each configuration: its true value times the noise's quintile midpoints,
# so the table's median is the truth (a best picked from noisy medians would be a lucky one)
# and the replay's draws, pooled from these, are the noise.
NOISE_QUANTILES = (-1.28, -0.52, 0.0, 0.52, 1.28)
REPEATS = len(NOISE_QUANTILES)


@dataclass(frozen=True)
class GptShape:
    """A GPT-style decoder: its sizes, and what follows from them (fp16/bf16 training)."""

    name: str
    layers: int
    hidden: int
    heads: int
    seq_len: int = 1024
    vocab: int = 50257

    @property
    def num_params(self) -> int:
        return 12 * self.layers * self.hidden**2 + (self.vocab + self.seq_len) * self.hidden

    @property
    def flops_per_sample(self) -> float:
        """Forward and backward: 6 per parameter and token, plus attention's scores."""
        attention = 12 * self.layers * self.hidden * self.seq_len**2
        return 6.0 * self.num_params * self.seq_len + attention

    @property
    def activation_bytes_per_sample(self) -> int:
        """Korthikanti et al.'s count for half precision without recomputation, per layer
        ``s·h·34 + 5·a·s²``, plus the logits."""
        per_layer = self.seq_len * self.hidden * 34 + 5 * self.heads * self.seq_len**2
        return self.layers * per_layer + 6 * self.seq_len * self.vocab

    def model_info(self) -> ModelInfo:
        return ModelInfo(
            num_params=self.num_params,
            param_bytes=2 * self.num_params,
            activation_bytes_per_sample=self.activation_bytes_per_sample,
            flops_per_sample=self.flops_per_sample,
        )


MODELS = {
    m.name: m
    for m in (
        GptShape("gpt-125m", 12, 768, 12),
        GptShape("gpt-350m", 24, 1024, 16),
        GptShape("gpt-1.3b", 24, 2048, 16),
        GptShape("gpt-7b", 32, 4096, 32, vocab=32000),
    )
}


def simulated_config(max_micro_batch: int, precision: str = "bf16") -> dict[str, Any]:
    """The config a simulated landscape is tuned under: DeepSpeed's fast mode over every
    stage in ``precision`` (fp16 or bf16) with AdamW."""
    return {
        precision: {"enabled": True},
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-4}},
        "zero_optimization": {"stage": "all", "overlap_comm": True},
        "autotuning": {
            "enabled": True,
            "metric": "throughput",
            "fast": True,
            "max_train_micro_batch_size_per_gpu": max_micro_batch,
            "tuner_early_stopping": 10,
            "tuner_num_trials": 60,
            "num_remeasure": 2,
        },
    }


def simulated_landscape(
    model: GptShape,
    hardware: str,
    world_size: int = 8,
    seed: int = 0,
    noise: float = 0.015,
    max_micro_batch: int = 64,
) -> dict[str, Any]:
    """A landscape table of ``model`` on ``world_size`` GPUs of ``hardware`` (one node of 8,
    or more), every stage at every micro-batch up to ``max_micro_batch``."""
    gpu = CATALOG[hardware]
    rng = random.Random(f"{model.name}/{hardware}/{world_size}/{seed}")
    # V100s have no bf16: they train in fp16, as DeepSpeed's published runs did.
    raw = simulated_config(max_micro_batch, "bf16" if "bf16" in gpu.peak_flops else "fp16")
    config = load_config(raw, world_size=world_size)
    info = model.model_info()
    space = build_space(config, info, gpu.memory_bytes)
    topology = Topology(world_size, min(gpu.gpus_per_node, world_size), config.precision)
    prior = prior_for(gpu, topology)
    true_u = np.array(prior.mean) + np.array([rng.gauss(0, CONSTANT_SPREAD) for _ in prior.mean])
    truth = CostModel.from_prior(prior)
    truth = CostModel(
        u=tuple(float(x) for x in true_u),
        covariance=truth.covariance,
        noise=0.0,
        misfit_measured=0.0,
        misfit_unmeasured=0.0,
        prior=prior,
    )
    model_shape = ModelShape(info.num_params, info.flops_per_sample)
    configs: dict[str, Any] = {}
    for plan in space.plans:  # each stage, offloaded where its states alone do not fit
        variant = plan.variant
        stage_factor = math.exp(rng.gauss(0, STAGE_SPREAD))
        memory_factor = math.exp(rng.gauss(0, MEMORY_SPREAD))
        estimate = estimate_memory(
            info, config, variant.stage, variant.offload_optimizer, gpu.memory_bytes
        )
        for size in range(1, max_micro_batch + 1):
            overrides = space.overrides(variant, size)
            name = space.name(overrides)
            needed = estimate.bytes_at(size) * memory_factor
            if needed > gpu.memory_bytes:
                configs[name] = {
                    "overrides": overrides,
                    "status": "oom",
                    "throughput": [],
                    "error": "OutOfMemoryError",
                    "duration_s": [5.0],
                }
                continue
            step = step_shape(config, {**space.base}, variant, size)
            (prediction,) = truth.predict([step_counts(model_shape, step, topology)], ["z"])
            latency = prediction.latency_s * stage_factor
            if needed > (1 - EDGE_SHARE) * gpu.memory_bytes:
                latency *= EDGE_SLOWDOWN
            samples = size * step.accumulation * world_size
            configs[name] = {
                "overrides": overrides,
                "status": "ok",
                "throughput": [samples / latency * math.exp(noise * z) for z in NOISE_QUANTILES],
                "peak_memory_bytes": int(needed),
                "duration_s": [10.0 + 15 * latency],
            }
    return {
        "format": LANDSCAPE_FORMAT,
        "how": {
            "workload": model.name,
            "workload_args": {},
            "world_size": world_size,
            "device_memory_bytes": gpu.memory_bytes,
            "config": raw,
            "repeats": REPEATS,
            "simulated": {"hardware": hardware, "seed": seed, "noise": noise},
        },
        "model_info": {
            "num_params": info.num_params,
            "param_bytes": info.param_bytes,
            "activation_bytes_per_sample": info.activation_bytes_per_sample,
            "flops_per_sample": info.flops_per_sample,
        },
        "configs": configs,
    }
