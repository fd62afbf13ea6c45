"""The built-in ZeRO engine (stages 0-3), shaped like DeepSpeed's.

Example:
    >>> import autotune as deepspeed
    >>> engine, optimizer, _, scheduler = deepspeed.initialize(model=model, config=ds_config)
    >>> loss = engine(inputs); engine.backward(loss); engine.step()
"""

from autotune.engine import memory
from autotune.engine.comm import CollectiveLog, Communicator
from autotune.engine.engine import ZeroEngine, initialize
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
    "memory",
    "model_state_bytes",
]
