"""NeMo's WarmupPolicy family and Noam schedules (nemo/core/optim/lr_scheduler.py) as closed forms.

Each rate is NeMo's at `last_epoch` = step, branch for branch, quirks included, so a NeMo config
trains with the rates it trained with under NeMo:
- the warmup is lr x (step + 1) / (warmup + 1), so step 0 already runs at lr / (warmup + 1);
- past max_steps every WarmupPolicy schedule drops to min_lr, even WarmupPolicy itself (constant);
- SquareRootAnnealing decays over the whole schedule, from step 0, not from the warmup's end;
- a hold schedule without hold_steps or hold_ratio has NeMo's hold end at 0, so the decays that
  count from the hold (PolynomialHoldDecayAnnealing, WarmupHoldAnnealLinear, ...) count from step 0;
- NoamAnnealing has no max_steps: it decays as step ** -0.5 for ever, down to min_lr at most.
Where NeMo divides by a decay of no steps (it raises), the schedule has ended: min_lr.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gptrain.train.schedule import ScheduleSpec

HOLD_POLICIES = (
    "WarmupHoldPolicy",
    "PolynomialHoldDecayAnnealing",
    "WarmupHoldAnnealLinear",
    "WarmupHoldAnnealOneMinusSquareRoot",
    "NoamHoldAnnealing",
)
POLYNOMIAL = ("PolynomialDecayAnnealing", "PolynomialHoldDecayAnnealing")
WARMUP_POLICIES = (
    "WarmupPolicy",
    "WarmupAnnealing",
    "SquareAnnealing",
    "SquareRootAnnealing",
    "InverseSquareRootAnnealing",
    "PolynomialDecayAnnealing",
    *HOLD_POLICIES,
)
"""NeMo's schedules built on WarmupPolicy: its warmup, then min_lr past max_steps."""
NOAM = "NoamAnnealing"
NEMO_SCHEDULES = (*WARMUP_POLICIES, NOAM)
NOT_TO_MIN_LR = ("WarmupPolicy", "WarmupHoldPolicy", "InverseSquareRootAnnealing", "NoamHoldAnnealing", NOAM)
"""Those whose rate does not come down to min_lr at max_steps (they hold lr, or decay as a power
of the step): a schedule longer than the run leaves no decay unfinished."""

# The schedule keys only some schedules take (NeMo's constructors refuse any other with a TypeError).
OWN_KEYS = {
    "hold_steps": HOLD_POLICIES,
    "hold_ratio": HOLD_POLICIES,
    "d_model": (NOAM,),
    "power": POLYNOMIAL,
    "cycle": POLYNOMIAL,
    "decay_rate": ("NoamHoldAnnealing",),
}
# What NeMo's constructors take where a config leaves these keys out (null here).
OWN_DEFAULTS = {"power": 1.0, "cycle": False, "decay_rate": 0.5}


def own_key_value(spec: ScheduleSpec, key: str) -> float | bool | None:
    """The value of OWN_KEYS' `key` the rates follow: a null is NeMo's default, where it has one."""
    value = getattr(spec, key)
    return OWN_DEFAULTS.get(key) if value is None else value


def hold_end(spec: ScheduleSpec) -> float:
    """NeMo's WarmupHoldPolicy.hold_steps: the step the hold ends, warmup + hold; 0 without a hold."""
    return 0 if spec.hold_steps is None else spec.warmup_steps + spec.hold_steps


def warmup_policy_lr(step: float, spec: ScheduleSpec) -> float:
    """WarmupPolicy.get_lr / WarmupHoldPolicy.get_lr: warmup, hold, min_lr past max_steps, decay."""
    warmup = spec.warmup_steps
    if warmup > 0 and step <= warmup:
        if spec.warmup_style == "megatron":
            return spec.warmup_init_lr + (spec.lr - spec.warmup_init_lr) * step / warmup
        return spec.lr * (step + 1) / (warmup + 1)
    if step >= warmup and step < hold_end(spec):
        return spec.lr
    if step > spec.max_steps:
        return spec.min_lr
    return _DECAYS[spec.name](step, spec)


def noam_lr(step: float, spec: ScheduleSpec) -> float:
    """NoamAnnealing: lr x d_model ** -0.5 x min(step ** -0.5, step x warmup ** -1.5), step at least
    1; floored at min_lr after the warmup."""
    step = max(1, step)
    scale = spec.d_model**-0.5  # type: ignore[operator]  (ScheduleSpec refuses Noam without it)
    if spec.warmup_steps > 0:
        rate = spec.lr * scale * min(step**-0.5, step * spec.warmup_steps**-1.5)
    else:
        rate = spec.lr * scale * step**-0.5
    return max(rate, spec.min_lr) if step > spec.warmup_steps else rate


def _constant(step: float, spec: ScheduleSpec) -> float:
    return spec.lr


def _warmup_annealing(step: float, spec: ScheduleSpec) -> float:
    """Linear from lr at the warmup's end to min_lr at max_steps."""
    done = (step - spec.warmup_steps) / (spec.max_steps - spec.warmup_steps)
    return spec.min_lr + (1 - done) * (spec.lr - spec.min_lr)


def _square_annealing(step: float, spec: ScheduleSpec) -> float:
    left = (spec.max_steps - step) / (spec.max_steps - spec.warmup_steps)
    return max(spec.lr * left**2, spec.min_lr)


def _square_root_annealing(step: float, spec: ScheduleSpec) -> float:
    """NeMo's decays over the whole schedule from step 0 (not from the warmup's end)."""
    if spec.max_steps <= 0:
        return spec.min_lr
    return max(spec.lr * ((spec.max_steps - step) / spec.max_steps) ** 0.5, spec.min_lr)


def _inverse_square_root(step: float, spec: ScheduleSpec) -> float:
    return spec.lr / ((step + 1) / (spec.warmup_steps + 1)) ** 0.5


def _polynomial(step: float, spec: ScheduleSpec) -> float:
    """NeMo's _poly_decay from the warmup's end (PolynomialDecayAnnealing) or from the hold's end
    (PolynomialHoldDecayAnnealing, over max_steps - max(warmup, hold end))."""
    if spec.name == "PolynomialHoldDecayAnnealing":
        start, decay = hold_end(spec), spec.max_steps - max(spec.warmup_steps, hold_end(spec))
    else:
        start, decay = spec.warmup_steps, spec.max_steps - spec.warmup_steps
    return poly_decay(spec.lr, step - start, decay, spec.decay_power, spec.min_lr, spec.decay_cycle)


def poly_decay(lr: float, step: float, decay: float, power: float, min_lr: float, cycle: bool) -> float:
    """min_lr + (lr - min_lr) x (1 - step / decay) ** power; `cycle` stretches the decay to the next
    multiple of itself past its end, else the step stops at the decay's end."""
    if decay <= 0:
        return min_lr
    if cycle:
        decay *= 1.0 if step == 0 else math.ceil(step / decay)
    else:
        step = min(step, decay)
    return (lr - min_lr) * (1.0 - step / decay) ** power + min_lr


def _hold_anneal_linear(step: float, spec: ScheduleSpec) -> float:
    """WarmupHoldAnnealLinear: linear from lr at the hold's end to min_lr at max_steps."""
    decay = spec.max_steps - hold_end(spec)
    if decay <= 0:
        return spec.min_lr
    return spec.lr - (spec.lr - spec.min_lr) * (step - hold_end(spec)) / decay


def _hold_anneal_one_minus_sqrt(step: float, spec: ScheduleSpec) -> float:
    """WarmupHoldAnnealOneMinusSquareRoot: lr x (1 - sqrt(progress after the hold)), at least min_lr."""
    decay = spec.max_steps - hold_end(spec)
    if decay <= 0:
        return spec.min_lr
    return max(spec.min_lr, spec.lr * (1 - ((step - hold_end(spec)) / decay) ** 0.5))


def _noam_hold(step: float, spec: ScheduleSpec) -> float:
    """NoamHoldAnnealing: lr x warmup ** rate / (step - hold) ** rate after the hold (each base at
    least 1), at least min_lr; `hold` is the hold alone, not warmup + hold."""
    hold = hold_end(spec) - spec.warmup_steps if hold_end(spec) > 0 else 0
    rate = spec.noam_decay_rate
    peak = max(1, spec.warmup_steps**rate)
    return max(spec.lr * peak / max(1, (step - hold) ** rate), spec.min_lr)


_DECAYS = {
    "WarmupPolicy": _constant,
    "WarmupHoldPolicy": _constant,
    "WarmupAnnealing": _warmup_annealing,
    "SquareAnnealing": _square_annealing,
    "SquareRootAnnealing": _square_root_annealing,
    "InverseSquareRootAnnealing": _inverse_square_root,
    "PolynomialDecayAnnealing": _polynomial,
    "PolynomialHoldDecayAnnealing": _polynomial,
    "WarmupHoldAnnealLinear": _hold_anneal_linear,
    "WarmupHoldAnnealOneMinusSquareRoot": _hold_anneal_one_minus_sqrt,
    "NoamHoldAnnealing": _noam_hold,
}
