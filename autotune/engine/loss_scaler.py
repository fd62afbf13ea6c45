"""fp16 loss scaling: a fixed scale, or DeepSpeed's dynamic scaler with hysteresis."""

from __future__ import annotations

from autotune.config import FP16Config


class LossScaler:
    """A fixed loss scale (``fp16.loss_scale`` > 0, or 1 when fp16 is off): never changes."""

    def __init__(self, scale: float = 1.0) -> None:
        self.scale = float(scale)

    @property
    def dynamic(self) -> bool:
        return False

    def update(self, overflow: bool) -> None:
        """Called once per optimizer step; a fixed scale ignores overflows."""

    def state_dict(self) -> dict[str, float | int]:
        return {"scale": self.scale}

    def load_state_dict(self, state: dict[str, float | int]) -> None:
        self.scale = float(state["scale"])


class DynamicLossScaler(LossScaler):
    """DeepSpeed's dynamic loss scaler.

    An overflow halves the scale (by ``scale_factor``) once ``hysteresis`` overflows have been
    tolerated, never going below ``min_scale``; ``scale_window`` clean steps since the last
    overflow double it. Hysteresis is restored when the scale grows, or after every clean step
    when ``consecutive_hysteresis`` is on (so only consecutive overflows use it up).
    """

    def __init__(
        self,
        init_scale: float,
        scale_window: int,
        hysteresis: int,
        consecutive_hysteresis: bool,
        min_scale: float,
        scale_factor: float = 2.0,
    ) -> None:
        super().__init__(init_scale)
        self.scale_window = scale_window
        self.hysteresis = hysteresis
        self.consecutive_hysteresis = consecutive_hysteresis
        self.min_scale = min_scale
        self.scale_factor = scale_factor
        self.hysteresis_left = hysteresis
        self._iteration = 0
        self._last_overflow_iteration = -1

    @property
    def dynamic(self) -> bool:
        return True

    def update(self, overflow: bool) -> None:
        if overflow:
            if self.hysteresis_left <= 1:
                self.scale = max(self.scale / self.scale_factor, self.min_scale)
            else:
                self.hysteresis_left -= 1
            self._last_overflow_iteration = self._iteration
        else:
            if self.consecutive_hysteresis:
                self.hysteresis_left = self.hysteresis
            if (self._iteration - self._last_overflow_iteration) % self.scale_window == 0:
                self.hysteresis_left = self.hysteresis
                self.scale *= self.scale_factor
        self._iteration += 1

    def state_dict(self) -> dict[str, float | int]:
        return {
            "scale": self.scale,
            "hysteresis_left": self.hysteresis_left,
            "iteration": self._iteration,
            "last_overflow_iteration": self._last_overflow_iteration,
        }

    def load_state_dict(self, state: dict[str, float | int]) -> None:
        super().load_state_dict(state)
        self.hysteresis_left = int(state["hysteresis_left"])
        self._iteration = int(state["iteration"])
        self._last_overflow_iteration = int(state["last_overflow_iteration"])


def build_loss_scaler(fp16: FP16Config) -> LossScaler:
    """The scaler the ``fp16`` section asks for; a no-op scale of 1 when fp16 is off."""
    if fp16.enabled is not True:
        return LossScaler(1.0)
    if fp16.loss_scale > 0:
        return LossScaler(fp16.loss_scale)
    return DynamicLossScaler(
        init_scale=2.0**fp16.initial_scale_power,
        scale_window=fp16.loss_scale_window,
        hysteresis=fp16.hysteresis,
        consecutive_hysteresis=fp16.consecutive_hysteresis,
        min_scale=fp16.min_loss_scale,
    )
