"""Warnings, at start, for a learning-rate schedule that cannot happen as written.

A preset's warmup (e.g. gpt3/126m's 636 steps) longer than a short test run means the rate
never reaches `model.optim.lr`, and a schedule length (`model.optim.sched.max_steps`,
`decay_samples`) other than the run's length stops the decay early or leaves most of the run at
min_lr. None of this is wrong for every purpose, so these are warnings, not errors; min_lr above
lr is an error (ScheduleSpec refuses it).

The schedule counts steps of the full global batch: a batch-size ramp-up's smaller batches move it
by their share (Megatron counts it in samples), so where it stands at an iteration is the samples
consumed by then over the full batch, not the iteration itself.

At a resume, `resumed_schedule_change` is the line for a schedule the config changed since the
checkpoint (its settings are recorded there): not wrong either, but a jump of the rate is never silent.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from gptrain.train.rampup import BatchRamp
from gptrain.train.schedule import LRSchedule, ScheduleSpec, lr_at

if TYPE_CHECKING:
    from gptrain.config.schema import TrainingConfig

# The run may spend this fraction of its steps at min_lr after the schedule ended before we warn.
LONG_TAIL = 0.1


def run_schedule_warnings(cfg: TrainingConfig, spec: ScheduleSpec) -> list[str]:
    """schedule_warnings for the run `cfg` configures: its ramp-up and the key that set the length."""
    m, sched = cfg.model, cfg.model.optim.sched
    ramp = BatchRamp.from_config(m.rampup_batch_size, m.global_batch_size, 1)
    if sched.decay_samples is not None:
        length = f"model.optim.sched.decay_samples={sched.decay_samples}, a schedule of {_steps(spec.max_steps)} steps"
    elif sched.max_steps is None:
        length = f"model.optim.sched.max_steps=null, a schedule of {_steps(spec.max_steps)} steps"
    else:
        length = None
    return schedule_warnings(spec, cfg.trainer.max_steps, ramp, length)


def schedule_warnings(
    spec: ScheduleSpec, run_steps: int, ramp: BatchRamp | None = None, length: str | None = None
) -> list[str]:
    """One line per problem of `spec` for a run of `run_steps` optimizer steps (trainer.max_steps)
    under `ramp`; `length` names the setting that gave the schedule's length (None:
    model.optim.sched.max_steps)."""
    if run_steps <= 0:
        return []
    ramp = ramp or BatchRamp(spec.global_batch_size or 1)
    warnings = []
    last = schedule_position(ramp, run_steps - 1)  # where the run's last step takes its rate
    if spec.warmup_steps > last:
        warnings.append(
            f"model.optim.sched.warmup_steps={_steps(spec.warmup_steps)} is not shorter than trainer.max_steps="
            f"{run_steps}: the learning rate never reaches model.optim.lr={spec.lr:g} (at most"
            f" {lr_at(last, spec):.3g}); lower warmup_steps or raise trainer.max_steps"
        )
    if spec.name == "Constant" or spec.warmup_steps > last:  # no decay to check, or none reached
        return warnings
    if spec.warmup_steps + spec.constant_steps >= spec.max_steps:
        warnings.append(
            f"model.optim.sched.warmup_steps + constant_steps = {_steps(spec.warmup_steps + spec.constant_steps)}"
            f" leaves no decay in a schedule of {_steps(spec.max_steps)} steps: the rate drops from"
            f" {spec.lr:g} to min_lr={spec.min_lr:g} at once after warmup"
        )
    schedule = length or f"model.optim.sched.max_steps={_steps(spec.max_steps)}"
    return warnings + _length_warnings(spec, run_steps, ramp, schedule)


def _length_warnings(spec: ScheduleSpec, run_steps: int, ramp: BatchRamp, schedule: str) -> list[str]:
    """The decay ending after the run, or long before it. A schedule in samples, or one under a
    ramp-up, follows the run when its length is the samples the run consumes."""
    end = schedule_position(ramp, run_steps)
    run = f"trainer.max_steps={run_steps}"
    if ramp.start is not None:
        run += f" (with its ramp-up's smaller batches, {_steps(end)} steps of the full batch)"
    if ramp.start is not None or "decay_samples" in schedule:
        follow = f"set model.optim.sched.decay_samples={ramp.samples_for(run_steps)} (the samples the run consumes)"
    else:
        follow = "set model.optim.sched.max_steps=null"
    if spec.max_steps - end >= 1:  # less is the partial last batch a run in samples leaves out
        last_rate = lr_at(schedule_position(ramp, run_steps - 1), spec)
        return [
            f"the decay ends after the run: {schedule} > {run}, so the last rate is {last_rate:.3g}, not"
            f" min_lr={spec.min_lr:g}; {follow} to follow the run"
        ]
    tail = run_steps - ramp.iterations_to_consume(spec.max_steps * ramp.global_batch_size)
    if tail > LONG_TAIL * run_steps:
        return [
            f"the decay ends long before the run: {schedule} < {run}, so the last {tail} steps run at"
            f" min_lr={spec.min_lr:g}; {follow} to follow the run"
        ]
    return []


def schedule_position(ramp: BatchRamp, iterations: int) -> float:
    """Steps of the full global batch the schedule has moved after `iterations` updates."""
    return ramp.samples_for(iterations) / ramp.global_batch_size


def _steps(value: float) -> str:
    """A step count as written: whole ones as integers, a fraction (a length in samples) to 2 places."""
    return str(int(value)) if float(value).is_integer() else f"{value:.2f}"


def resumed_schedule_change(cfg: TrainingConfig, schedule: LRSchedule, iteration: int) -> str | None:
    """One line naming each schedule setting this run's config changed since the checkpoint `schedule`
    was loaded from (old -> new), and the learning rate of the coming `iteration` by each schedule:
    a raised trainer.max_steps stretches the decay, and the rate jumps. None when nothing changed,
    or the checkpoint (from before they were recorded) holds no settings."""
    if schedule.resumed is None:
        return None
    old, saved_step = schedule.resumed
    changes = [
        f"{key} {shown(before)} -> {shown(after)}"
        for key, before, after, shown in _recorded_settings(cfg, old, schedule.spec)
        if not _same(before, after)
    ]
    if not changes:
        return None
    return (
        f"learning-rate schedule changed since the checkpoint (this run's config applies): {', '.join(changes)};"
        f" learning rate of iteration {iteration}: {lr_at(saved_step, old):.6E} by the checkpoint's schedule,"
        f" {lr_at(schedule.step, schedule.spec):.6E} now (set them back to go on with the checkpoint's)"
    )


Setting = tuple[str, Any, Any, Callable[[Any], str]]


def _recorded_settings(cfg: TrainingConfig, old: ScheduleSpec, new: ScheduleSpec) -> list[Setting]:
    """(the key that sets it in `cfg`, the checkpoint's value, this run's, how to show one) for each
    setting a checkpoint records; a length set in samples (decay_samples, warmup_samples) is
    compared in samples, as Megatron counts it."""
    sched = cfg.model.optim.sched
    if sched.decay_samples is not None:
        length = "model.optim.sched.decay_samples"
    else:
        length = "model.optim.sched.max_steps" if sched.max_steps else "trainer.max_steps"
    warmup = "model.optim.sched.warmup_steps"
    for key in ("warmup_samples", "warmup_fraction", "warmup_ratio"):
        if getattr(sched, key) is not None:
            warmup = (
                "model.optim.sched.warmup_samples"
                if key == "warmup_samples"
                else f"warmup steps (model.optim.sched.{key})"
            )
    constant = "model.optim.sched.constant_steps"
    if sched.constant_ratio is not None:
        constant = "constant steps (model.optim.sched.constant_ratio)"

    def length_of(field: str, key: str) -> Setting:
        before, after = getattr(old, field), getattr(new, field)
        if key.endswith("_samples") and old.global_batch_size:
            before, after = before * old.global_batch_size, after * new.global_batch_size
        return key, before, after, _steps

    return [
        ("model.optim.sched.name", old.name, new.name, str),
        ("model.optim.lr", old.lr, new.lr, "{:g}".format),
        ("model.optim.sched.min_lr", old.min_lr, new.min_lr, "{:g}".format),
        length_of("max_steps", length),
        length_of("warmup_steps", warmup),
        length_of("constant_steps", constant),
        ("model.optim.sched.warmup_style", old.warmup_style, new.warmup_style, str),
    ]


def _same(before: Any, after: Any) -> bool:
    """Equal, or for numbers equal up to rounding (a length in samples goes through steps)."""
    if isinstance(before, str) or isinstance(after, str):
        return before == after
    return math.isclose(before, after, rel_tol=1e-9, abs_tol=1e-12)
