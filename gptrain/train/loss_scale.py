"""Megatron's dynamic loss scaler for fp16 training.

Every overflowing iteration is skipped; the scale backs off only after `hysteresis`
overflows since the last growth, and grows after `growth_interval` clean iterations.
With bf16/fp32 a constant scale of 1.0 is used (Megatron prints 1.0 there too); with fp16 and
model.native_amp_static_scale, the constant model.native_amp_init_scale (Megatron's --loss-scale):
an overflowing iteration is skipped and the scale stays.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class DynamicLossScaler:
    """State: scale, clean-iteration count, remaining hysteresis (all saved in checkpoints)."""

    scale: float = 2.0**32
    min_scale: float = 1.0
    growth_factor: float = 2.0
    backoff_factor: float = 0.5
    growth_interval: int = 1000
    hysteresis: int = 2
    growth_tracker: int = 0
    hysteresis_tracker: int = -1

    def __post_init__(self) -> None:
        if self.hysteresis_tracker < 0:
            self.hysteresis_tracker = self.hysteresis

    def can_back_off(self) -> bool:
        """Whether an overflow can still lower the scale (it stops at min_scale)."""
        return self.scale > self.min_scale

    def update(self, found_inf: bool) -> None:
        """Call once per iteration with whether the gradients overflowed."""
        if found_inf:
            self.growth_tracker = 0
            self.hysteresis_tracker -= 1
            if self.hysteresis_tracker <= 0:
                self.scale = max(self.scale * self.backoff_factor, self.min_scale)
            return
        self.growth_tracker += 1
        if self.growth_tracker >= self.growth_interval:  # a resume may have lowered the interval
            self.growth_tracker = 0
            self.hysteresis_tracker = self.hysteresis
            self.scale *= self.growth_factor

    def state_dict(self) -> dict[str, float | int]:
        return {
            "scale": self.scale,
            "growth_tracker": self.growth_tracker,
            "hysteresis_tracker": self.hysteresis_tracker,
        }

    def load_state_dict(self, state: dict) -> None:
        self.scale = float(state["scale"])
        self.growth_tracker = int(state["growth_tracker"])
        self.hysteresis_tracker = int(state["hysteresis_tracker"])


@dataclass
class ConstantLossScaler:
    """A scale that never changes: 1.0 (fp32, bf16: no scaling) or fp16's static scale.

    The configured scale is the run's, as Megatron's ConstantGradScaler keeps --loss-scale over its
    checkpoint: a resume does not take the saved one (a static scale changed in the config, or the
    1.0 of a bf16 checkpoint, would otherwise replace it). The scale is still saved, for the record.
    """

    scale: float = 1.0

    def can_back_off(self) -> bool:
        return False

    def update(self, found_inf: bool) -> None:
        del found_inf

    def state_dict(self) -> dict[str, float]:
        return {"scale": self.scale}

    def load_state_dict(self, state: dict) -> None:
        del state


LossScaler = DynamicLossScaler | ConstantLossScaler


def build_loss_scaler(
    precision: str, initial_scale: float, growth_interval: int, hysteresis: int, static: bool = False
) -> LossScaler:
    if precision == "16" and static:
        return ConstantLossScaler(scale=initial_scale)
    if precision == "16":
        return DynamicLossScaler(scale=initial_scale, growth_interval=growth_interval, hysteresis=hysteresis)
    return ConstantLossScaler()
