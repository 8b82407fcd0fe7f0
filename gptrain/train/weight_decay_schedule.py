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
from typing import TYPE_CHECKING, Any

from gptrain.errors import ConfigError

if TYPE_CHECKING:
    from gptrain.config.schema import TrainingConfig

INCREMENT_STYLES = ("constant", "linear", "cosine")


@dataclass(frozen=True)
class WeightDecaySpec:
    """A weight decay that changes over the run (constant ones are model.optim.weight_decay; a checkpoint
    records one as style constant, start and end its value, as Megatron's start_wd and end_wd)."""

    style: str
    start: float
    end: float
    steps: float
    """The run's length in steps of the full global batch (Megatron's wd_incr_steps)."""


def wd_at(step: float, spec: WeightDecaySpec) -> float:
    """The weight decay of optimizer step `step` (0-based), as Megatron's get_wd (a constant one's is
    its end, which is its start)."""
    if spec.style == "constant" or step > spec.steps:
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


# The schedule state's keys of the weight decay a checkpoint was trained with (Megatron's scheduler
# state holds start_wd, end_wd, wd_incr_steps, wd_incr_style).
RECORD_KEYS = {
    "style": "weight_decay_incr_style",
    "start": "start_weight_decay",
    "end": "end_weight_decay",
    "steps": "weight_decay_incr_steps",
}
RECORD_NAMES = "model.optim.weight_decay, weight_decay_incr_style, start_weight_decay, end_weight_decay"


def weight_decay_record(spec: WeightDecaySpec) -> dict[str, Any]:
    """`spec` as the schedule's state records it."""
    return {key: getattr(spec, field) for field, key in RECORD_KEYS.items()}


def recorded_weight_decay(state: dict[str, Any]) -> WeightDecaySpec | None:
    """The weight decay a schedule state records; None for a checkpoint from before the record."""
    if not all(key in state for key in RECORD_KEYS.values()):
        return None
    values = {field: state[key] for field, key in RECORD_KEYS.items()}
    return WeightDecaySpec(str(values.pop("style")), **{k: float(v) for k, v in values.items()})


def weight_decay_change(
    old: WeightDecaySpec,
    old_step: float,
    old_batch: int,
    new: WeightDecaySpec,
    step: float,
    batch: int,
    iteration: int,
) -> str | None:
    """One line naming how this run's weight decay differs from the checkpoint's (its length compared in
    samples, as Megatron counts it) and the decay of the coming `iteration` by each; None when the same.
    The decay of each step is not a setting: only the style, bounds and length are compared."""
    if _same(old, old_batch, new, batch):
        return None
    return (
        f"weight decay changed since the checkpoint (this run's config applies): {described(old)} ->"
        f" {described(new)} ({RECORD_NAMES}); weight decay of iteration {iteration}: {wd_at(old_step, old):g} by"
        f" the checkpoint's, {wd_at(step, new):g} now (set them back to go on with the checkpoint's)"
    )


def _same(old: WeightDecaySpec, old_batch: int, new: WeightDecaySpec, batch: int) -> bool:
    if (old.style, old.start, old.end) != (new.style, new.start, new.end):
        return False
    if old.style == "constant":  # a constant's length decides nothing
        return True
    old_unit, unit = (old_batch, batch) if old_batch and batch else (1, 1)
    return old.steps * old_unit == new.steps * unit


def described(spec: WeightDecaySpec) -> str:
    """'constant 0.1', or 'linear from 0 to 0.3 over 6 steps'."""
    if spec.style == "constant":
        return f"constant {spec.end:g}"
    steps = int(spec.steps) if float(spec.steps).is_integer() else round(spec.steps, 2)
    return f"{spec.style} from {spec.start:g} to {spec.end:g} over {steps} steps"
