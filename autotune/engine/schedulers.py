"""DeepSpeed's learning-rate schedules as torch LR schedulers.

DeepSpeed counts ``last_batch_iteration`` from -1 and steps after every optimizer step, with the
optimizer starting at the schedule's value for iteration -1. A torch scheduler's ``last_epoch``
is 0 after construction, so here ``iteration = last_epoch - 1``: the learning rate used by the
n-th optimizer step is DeepSpeed's exactly.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch.optim.lr_scheduler import LRScheduler

from autotune.config import ConfigError, SchedulerConfig


class _DeepSpeedSchedule(LRScheduler):
    """Base: subclasses give the learning rate of one base rate at a DeepSpeed iteration."""

    def __init__(self, optimizer: torch.optim.Optimizer, last_batch_iteration: int = -1) -> None:
        super().__init__(optimizer, last_epoch=last_batch_iteration)

    def get_lr(self) -> list[float]:  # type: ignore[override]
        iteration = self.last_epoch - 1
        return [self.lr_at(iteration, i) for i in range(len(self.optimizer.param_groups))]

    def lr_at(self, iteration: int, group: int) -> float:
        raise NotImplementedError


def _warmup_gamma(iteration: int, warmup_num_steps: int, warmup_type: str) -> float:
    """DeepSpeed's warm-up fraction: 0 at the start, 1 from ``warmup_num_steps`` on."""
    if iteration < 0:
        return 0.0
    if iteration >= warmup_num_steps:
        return 1.0
    if warmup_type == "log":
        return math.log(iteration + 1) / math.log(warmup_num_steps)
    return iteration / warmup_num_steps


class WarmupLR(_DeepSpeedSchedule):
    """From ``warmup_min_lr`` to ``warmup_max_lr`` over ``warmup_num_steps`` (log or linear)."""

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        warmup_min_lr: float = 0.0,
        warmup_max_lr: float = 1e-3,
        warmup_num_steps: int = 1000,
        warmup_type: str = "log",
        last_batch_iteration: int = -1,
    ) -> None:
        self.min_lr, self.max_lr = warmup_min_lr, warmup_max_lr
        self.warmup_num_steps = max(2, warmup_num_steps)
        self.warmup_type = warmup_type
        super().__init__(optimizer, last_batch_iteration)

    def gamma(self, iteration: int) -> float:
        return _warmup_gamma(iteration, self.warmup_num_steps, self.warmup_type)

    def lr_at(self, iteration: int, group: int) -> float:
        return self.min_lr + (self.max_lr - self.min_lr) * self.gamma(iteration)


class WarmupDecayLR(WarmupLR):
    """WarmupLR, then linear decay to 0 at ``total_num_steps``."""

    def __init__(
        self, optimizer: torch.optim.Optimizer, total_num_steps: int, **warmup: Any
    ) -> None:
        self.total_num_steps = total_num_steps
        super().__init__(optimizer, **warmup)

    def gamma(self, iteration: int) -> float:
        if iteration < self.warmup_num_steps:
            return super().gamma(iteration)
        remaining = self.total_num_steps - iteration
        return max(0.0, remaining / max(1.0, self.total_num_steps - self.warmup_num_steps))


class WarmupCosineLR(_DeepSpeedSchedule):
    """A warm-up of the base rate's ratio, then cosine decay down to ``cos_min_ratio``."""

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        total_num_steps: int,
        warmup_min_ratio: float = 0.0,
        warmup_num_steps: int = 1000,
        cos_min_ratio: float = 1e-4,
        warmup_type: str = "log",
        last_batch_iteration: int = -1,
    ) -> None:
        self.total_num_steps = total_num_steps
        self.warmup_min_ratio, self.cos_min_ratio = warmup_min_ratio, cos_min_ratio
        self.warmup_num_steps = max(2, warmup_num_steps)
        self.warmup_type = warmup_type
        self.org_lrs = [group["lr"] for group in optimizer.param_groups]
        super().__init__(optimizer, last_batch_iteration)

    def lr_at(self, iteration: int, group: int) -> float:
        if iteration < self.warmup_num_steps:
            gamma = _warmup_gamma(iteration, self.warmup_num_steps, self.warmup_type)
            ratio = self.warmup_min_ratio + (1.0 - self.warmup_min_ratio) * gamma
        else:
            progress = (iteration - self.warmup_num_steps + 1) / max(
                1, self.total_num_steps - self.warmup_num_steps
            )
            cosine = (1 + math.cos(math.pi * progress)) / 2
            ratio = max(0.0, self.cos_min_ratio + (1.0 - self.cos_min_ratio) * cosine)
        return self.org_lrs[group] * ratio


class OneCycle(_DeepSpeedSchedule):
    """DeepSpeed's 1-cycle policy: up to ``cycle_max_lr``, back down, then optional decay.

    With ``cycle_momentum`` the momentum (``betas[0]`` or ``momentum``) cycles the other way.
    """

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        cycle_min_lr: float,
        cycle_max_lr: float,
        decay_lr_rate: float = 0.0,
        cycle_first_step_size: int = 2000,
        cycle_second_step_size: int | None = None,
        cycle_first_stair_count: int = 0,
        cycle_second_stair_count: int | None = None,
        decay_step_size: int = 0,
        cycle_momentum: bool = True,
        cycle_min_mom: float = 0.8,
        cycle_max_mom: float = 0.9,
        decay_mom_rate: float = 0.0,
        last_batch_iteration: int = -1,
    ) -> None:
        second = cycle_second_step_size or cycle_first_step_size
        self.total_size = cycle_first_step_size + second
        self.step_ratio = cycle_first_step_size / self.total_size
        self.min_lr, self.max_lr, self.decay_lr_rate = cycle_min_lr, cycle_max_lr, decay_lr_rate
        self.decay_step_size = decay_step_size
        self.cycle_momentum = cycle_momentum
        self.min_mom, self.max_mom, self.decay_mom_rate = (
            cycle_min_mom,
            cycle_max_mom,
            decay_mom_rate,
        )
        super().__init__(optimizer, last_batch_iteration)

    def _scale(self, iteration: int) -> float:
        x = (iteration + 1) / self.total_size
        x -= math.floor(x)  # position inside the current cycle
        return x / self.step_ratio if x <= self.step_ratio else (x - 1) / (self.step_ratio - 1)

    def _decay_intervals(self, iteration: int) -> float:
        return (iteration - self.total_size + 1) / self.decay_step_size

    def lr_at(self, iteration: int, group: int) -> float:
        if iteration < self.total_size:
            return self.min_lr + (self.max_lr - self.min_lr) * self._scale(iteration)
        if self.decay_lr_rate == 0 or self.decay_step_size == 0:
            return self.min_lr
        return self.min_lr / (1 + self.decay_lr_rate * self._decay_intervals(iteration))

    def momentum_at(self, iteration: int) -> float:
        if iteration < self.total_size:
            return self.max_mom - (self.max_mom - self.min_mom) * self._scale(iteration)
        if self.decay_mom_rate == 0 or self.decay_step_size == 0:
            return self.max_mom
        return self.max_mom * (1 + self.decay_mom_rate * self._decay_intervals(iteration))

    def step(self, epoch: int | None = None) -> None:
        super().step(epoch)
        if not self.cycle_momentum:
            return
        momentum = self.momentum_at(self.last_epoch - 1)
        for group in self.optimizer.param_groups:
            if "betas" in group:
                group["betas"] = (momentum, *group["betas"][1:])
            elif "momentum" in group:
                group["momentum"] = momentum


class LRRangeTest(_DeepSpeedSchedule):
    """Learning rate growing from ``lr_range_test_min_lr`` to find a good maximum."""

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        lr_range_test_min_lr: float = 1e-3,
        lr_range_test_step_size: int = 2000,
        lr_range_test_step_rate: float = 1.0,
        lr_range_test_staircase: bool = False,
        last_batch_iteration: int = -1,
    ) -> None:
        self.min_lr, self.step_size = lr_range_test_min_lr, lr_range_test_step_size
        self.step_rate, self.staircase = lr_range_test_step_rate, lr_range_test_staircase
        super().__init__(optimizer, last_batch_iteration)

    def lr_at(self, iteration: int, group: int) -> float:
        interval = (iteration + 1) / self.step_size
        if self.staircase:
            interval = math.floor(interval)
        return self.min_lr * (1 + self.step_rate * interval)


SCHEDULERS: dict[str, type[_DeepSpeedSchedule]] = {
    "WarmupLR": WarmupLR,
    "WarmupDecayLR": WarmupDecayLR,
    "WarmupCosineLR": WarmupCosineLR,
    "OneCycle": OneCycle,
    "LRRangeTest": LRRangeTest,
}


def build_scheduler(
    config: SchedulerConfig | None, optimizer: torch.optim.Optimizer
) -> LRScheduler | None:
    """The schedule ``config`` names, attached to ``optimizer``; None without a config."""
    if config is None:
        return None
    params = config.typed_params().model_dump()
    auto = [key for key, value in params.items() if value == "auto"]
    if auto:
        raise ConfigError(f"scheduler.params.{auto[0]}", '"auto" must be resolved before training')
    return SCHEDULERS[config.type](optimizer, **params)
