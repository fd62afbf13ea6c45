"""The built-in ZeRO engine (stages 0-3), shaped like DeepSpeed's.

Example (a lone process trains on its own; under torchrun the ranks share the work):
    >>> import torch
    >>> import autotune as deepspeed
    >>> from autotune.workloads import build_mlp
    >>> mlp = build_mlp(d_in=8, d_hidden=16, n_layer=1)
    >>> ds_config = {"train_micro_batch_size_per_gpu": 4, "zero_optimization": {"stage": 2},
    ...              "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}}}
    >>> engine, optimizer, _, scheduler = deepspeed.initialize(model=mlp.model, config=ds_config)
    >>> inputs = mlp.make_batch(4, torch.Generator().manual_seed(0))
    >>> loss = engine(*inputs)
    >>> engine.backward(loss)  # returns the loss, as DeepSpeed's does
    tensor(..., grad_fn=<NllLossBackward0>)
    >>> engine.step()
    >>> engine.global_steps, engine.zero_optimization_stage()
    (1, 2)
"""

from autotune.engine import memory_tracker
from autotune.engine.collectives import CollectiveLog, Communicator
from autotune.engine.engine import ZeroEngine
from autotune.engine.entry import initialize
from autotune.engine.launch import add_config_arguments, init_distributed
from autotune.engine.loss_scaler import DynamicLossScaler, LossScaler, build_loss_scaler
from autotune.engine.optimizers import Lamb, build_optimizer
from autotune.engine.schedulers import (
    LRRangeTest,
    OneCycle,
    WarmupCosineLR,
    WarmupDecayLR,
    WarmupLR,
    build_scheduler,
)
from autotune.model_states import ModelStateBytes, model_state_bytes

__all__ = [
    "CollectiveLog",
    "Communicator",
    "DynamicLossScaler",
    "LRRangeTest",
    "Lamb",
    "LossScaler",
    "ModelStateBytes",
    "OneCycle",
    "WarmupCosineLR",
    "WarmupDecayLR",
    "WarmupLR",
    "ZeroEngine",
    "add_config_arguments",
    "build_loss_scaler",
    "build_optimizer",
    "build_scheduler",
    "init_distributed",
    "initialize",
    "memory_tracker",
    "model_state_bytes",
]
