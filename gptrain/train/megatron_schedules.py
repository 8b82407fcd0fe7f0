"""Megatron-LM's inverse-square-root and WSD decays (OptimizerParamScheduler.get_lr) as closed forms.

`gptrain megatron` reaches them from `--lr-decay-style inverse-square-root` and `WSD`; a config
names them `MegatronInverseSquareRoot` (not NeMo's InverseSquareRootAnnealing, whose warmup and
decay differ) and `WarmupStableDecay`. The linear warmup from warmup_init_lr comes first
(schedule.lr_at); past the decay's end (max_steps, Megatron's lr_decay_steps) both are at min_lr.

Megatron counts its scheduler in samples (an iteration of a constant batch is global_batch_size
of them); gptrain in steps of the full batch, the same ratios. Only the inverse square root sees
the unit: Megatron takes max(warmup, 1) and max(step, 1) in samples, so without a warmup its rate
at iteration i is lr / sqrt(i x global batch), as here.

WSD holds lr until wsd_decay_steps before the decay's end, then anneals to min_lr by
wsd_decay_style: linear 1 - r, cosine (1 + cos(pi r)) / 2, exponential 2 x 0.5 ** r - 1,
minus_sqrt 1 - sqrt(r), r the fraction of the annealing done. An annealing longer than the decay
after the warmup starts within it, as in Megatron: the rate steps down when the warmup ends.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gptrain.train.schedule import ScheduleSpec

INVERSE_SQUARE_ROOT = "MegatronInverseSquareRoot"
WSD = "WarmupStableDecay"
MEGATRON_SCHEDULES = (INVERSE_SQUARE_ROOT, WSD)

WSD_ANNEALS: dict[str, Callable[[float], float]] = {
    "linear": lambda ratio: 1.0 - ratio,
    "cosine": lambda ratio: 0.5 * (math.cos(math.pi * ratio) + 1.0),
    "exponential": lambda ratio: 2.0 * math.pow(0.5, ratio) - 1.0,
    "minus_sqrt": lambda ratio: 1.0 - math.sqrt(ratio),
}
WSD_DEFAULT_ANNEAL = "exponential"
"""Megatron's --lr-wsd-decay-style default."""


def megatron_decay_lr(step: float, spec: ScheduleSpec) -> float:
    """The rate after the warmup: min_lr past max_steps, else the schedule's decay."""
    if step > spec.max_steps:
        return spec.min_lr
    if spec.name == INVERSE_SQUARE_ROOT:
        return _inverse_square_root(step, spec)
    return _wsd(step, spec)


def _inverse_square_root(step: float, spec: ScheduleSpec) -> float:
    """lr x sqrt(warmup / step), both in samples and at least 1 sample; at least min_lr."""
    batch = spec.global_batch_size or 1
    warmup, samples = max(spec.warmup_steps * batch, 1), max(step * batch, 1)
    return max(spec.min_lr, spec.lr * warmup**0.5 / samples**0.5)


def _wsd(step: float, spec: ScheduleSpec) -> float:
    """lr until the annealing starts, then down to min_lr at max_steps."""
    annealing = spec.wsd_decay_steps or 0
    start = spec.max_steps - annealing
    if step <= start:  # an annealing of 0 steps never starts: lr, then min_lr past max_steps
        coeff = 1.0
    else:
        coeff = WSD_ANNEALS[spec.wsd_decay_style or WSD_DEFAULT_ANNEAL]((step - start) / annealing)
    return spec.min_lr + coeff * (spec.lr - spec.min_lr)
