"""What a DeepSpeed engine answers about itself, as :class:`~autotune.engine.engine.ZeroEngine`
answers it: the batch sizes, the stage and precision, ranks, the learning rate, the last
step's gradient norm and loss scale. Scripts and their libraries (the HF Trainer, Accelerate,
Lightning) read these; the engine's own work is in ``engine.py``.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

    from autotune.config import Config
    from autotune.engine.collectives import Communicator
    from autotune.engine.loss_scaler import LossScaler
    from autotune.engine.settings import ZeroSettings


class DeepSpeedAccessors:
    """DeepSpeed's accessors over the engine's state (a mixin of ``ZeroEngine``)."""

    config: Config
    zero: ZeroSettings
    communicator: Communicator
    optimizer: torch.optim.Optimizer
    loss_scaler: LossScaler
    global_steps: int
    _grad_norm: torch.Tensor | None
    _step_skipped: bool

    def train_batch_size(self) -> int:
        return int(self.config.train_batch_size)  # type: ignore[arg-type]

    def train_micro_batch_size_per_gpu(self) -> int:
        return int(self.config.train_micro_batch_size_per_gpu)  # type: ignore[arg-type]

    def gradient_accumulation_steps(self) -> int:
        return int(self.config.gradient_accumulation_steps)  # type: ignore[arg-type]

    def zero_optimization_stage(self) -> int:
        return self.zero.stage

    # Scripts pick their input dtype with these (DeepSpeedExamples' cifar does).
    def fp16_enabled(self) -> bool:
        return self.config.precision == "fp16"

    def bfloat16_enabled(self) -> bool:
        return self.config.precision == "bf16"

    def amp_enabled(self) -> bool:
        return False  # the engine casts the model itself; apex amp is never run

    def zero_optimization(self) -> bool:
        return self.zero.stage > 0

    def zero_cpu_offload(self) -> bool:
        return self.zero.offload_optimizer

    def gradient_clipping(self) -> float:
        return float(self.config.gradient_clipping)

    def steps_per_print(self) -> float:
        """Steps between progress prints (infinity: never, as Accelerate sets it)."""
        return self.config.steps_per_print

    def zero_optimization_partition_gradients(self) -> bool:
        return self.zero.stage >= 2

    def zero_optimization_partition_weights(self) -> bool:
        return self.zero.stage == 3

    def zero_gather_16bit_weights_on_model_save(self) -> bool:
        """Whether saving the model gathers whole weights at stage 3 (the config's
        ``stage3_gather_16bit_weights_on_model_save``, off by default, as in DeepSpeed)."""
        return self.config.zero_optimization.stage3_gather_16bit_weights_on_model_save is True

    def get_lr(self) -> list[float]:
        return [group["lr"] for group in self.optimizer.param_groups]

    @property
    def global_rank(self) -> int:
        return self.communicator.rank

    @property
    def world_size(self) -> int:
        return self.communicator.world_size

    @property
    def local_rank(self) -> int:
        """This process's rank on its node (torchrun's ``LOCAL_RANK``; 0 alone)."""
        return int(os.environ.get("LOCAL_RANK", "0"))

    @property
    def dp_world_size(self) -> int:
        return self.communicator.world_size

    def get_global_grad_norm(self) -> float | None:
        """The norm of the last optimizer step's gradients, unscaled and before clipping
        (None before the first step); inf or nan when an fp16 step overflowed."""
        return float(self._grad_norm) if self._grad_norm is not None else None

    def was_step_skipped(self) -> bool:
        """Whether the last optimizer step was skipped (an fp16 overflow)."""
        return self._step_skipped

    def get_global_step(self) -> int:
        return self.global_steps

    def get_loss_scale(self) -> float:
        return self.loss_scaler.scale
