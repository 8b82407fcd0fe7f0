"""Megatron's weight-decay increment (--weight-decay-incr-style linear/cosine, from
--start-weight-decay to --end-weight-decay over the run) as a closed form of the step.

Megatron's OptimizerParamScheduler.get_wd: at step s of a run of N (in samples, its unit; in steps of
the full batch here, the same ratio), r = s / N, linear start + r (end - start), cosine start +
(1 + cos(pi (1 - r))) / 2 x (end - start); past N, end. It sets the decay of every weight that decays
(the 1-D parameters keep none) before each step, with the learning rate (LRSchedule.apply).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from gptrain.errors import ConfigError

if TYPE_CHECKING:
    from gptrain.config.schema import TrainingConfig

INCREMENT_STYLES = ("constant", "linear", "cosine")


@dataclass(frozen=True)
class WeightDecaySpec:
    """A weight decay that changes over the run (constant ones are model.optim.weight_decay)."""

    style: str
    start: float
    end: float
    steps: float
    """The run's length in steps of the full global batch (Megatron's wd_incr_steps)."""


def wd_at(step: float, spec: WeightDecaySpec) -> float:
    """The weight decay of optimizer step `step` (0-based), as Megatron's get_wd."""
    if step > spec.steps:
        return spec.end
    ratio = step / spec.steps
    coeff = ratio if spec.style == "linear" else 0.5 * (math.cos(math.pi * (1 - ratio)) + 1.0)
    return spec.start + coeff * (spec.end - spec.start)


def weight_decay_spec(cfg: TrainingConfig) -> WeightDecaySpec | None:
    """model.optim's increment over the run (trainer.train_samples of the full batch where set, else
    trainer.max_steps, as Megatron counts --train-samples or --train-iters); None for a constant one.
    Checked as Megatron asserts: both bounds with linear or cosine, 0 <= start <= end, neither with constant."""
    o, prefix = cfg.model.optim, "model.optim."
    bounds = {"start_weight_decay": o.start_weight_decay, "end_weight_decay": o.end_weight_decay}
    if o.weight_decay_incr_style not in INCREMENT_STYLES:
        raise ConfigError(
            f"{prefix}weight_decay_incr_style: {o.weight_decay_incr_style!r} is not one of {', '.join(INCREMENT_STYLES)}"
        )
    if o.weight_decay_incr_style == "constant":
        given = [f"{prefix}{key}={value}" for key, value in bounds.items() if value is not None]
        if given:
            raise ConfigError(
                f"{' and '.join(given)} with {prefix}weight_decay_incr_style=constant: the decay is"
                f" {prefix}weight_decay; remove them, or give weight_decay_incr_style linear or cosine"
            )
        return None
    start, end = o.start_weight_decay, o.end_weight_decay
    if start is None or end is None:
        raise ConfigError(
            f"{prefix}weight_decay_incr_style={o.weight_decay_incr_style} needs {prefix}start_weight_decay and"
            f" {prefix}end_weight_decay"
        )
    if not 0 <= start <= end:
        raise ConfigError(
            f"{prefix}start_weight_decay={start} and {prefix}end_weight_decay={end}: give 0 <= start <= end"
            " (Megatron asserts it)"
        )
    samples = cfg.trainer.train_samples
    steps = samples / cfg.model.global_batch_size if samples else cfg.trainer.max_steps
    return WeightDecaySpec(o.weight_decay_incr_style, start, end, steps)
