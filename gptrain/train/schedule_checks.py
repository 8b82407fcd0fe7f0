"""Warnings, at start, for a learning-rate schedule that cannot happen as written.

A preset's warmup (e.g. gpt3/126m's 636 steps) longer than a short test run means the rate
never reaches `model.optim.lr`, and a schedule length (`model.optim.sched.max_steps`) other
than the run's length stops the decay early or leaves most of the run at min_lr. None of this
is wrong for every purpose, so these are warnings, not errors; min_lr above lr is an error
(ScheduleSpec refuses it).
"""

from __future__ import annotations

from gptrain.train.schedule import ScheduleSpec, lr_at

# The run may spend this fraction of its steps at min_lr after the schedule ended before we warn.
LONG_TAIL = 0.1


def schedule_warnings(spec: ScheduleSpec, run_steps: int) -> list[str]:
    """One line per problem of `spec` for a run of `run_steps` optimizer steps (trainer.max_steps)."""
    if run_steps <= 0:
        return []
    warnings = []
    last = run_steps - 1  # the rate of the run's last step
    if spec.warmup_steps >= run_steps:
        warnings.append(
            f"model.optim.sched.warmup_steps={spec.warmup_steps} is not shorter than trainer.max_steps="
            f"{run_steps}: the learning rate never reaches model.optim.lr={spec.lr:g} (at most"
            f" {lr_at(last, spec):.3g}); lower warmup_steps or raise trainer.max_steps"
        )
    if spec.name == "Constant":  # no decay to check
        return warnings
    if spec.warmup_steps < run_steps and spec.warmup_steps + spec.constant_steps >= spec.max_steps:
        warnings.append(
            f"model.optim.sched.warmup_steps + constant_steps = {spec.warmup_steps + spec.constant_steps}"
            f" leaves no decay in a schedule of {spec.max_steps} steps: the rate drops from"
            f" {spec.lr:g} to min_lr={spec.min_lr:g} at once after warmup"
        )
    if spec.max_steps > run_steps and spec.warmup_steps < run_steps:
        warnings.append(
            f"the decay ends after the run: model.optim.sched.max_steps={spec.max_steps} >"
            f" trainer.max_steps={run_steps}, so the last rate is {lr_at(last, spec):.3g}, not"
            f" min_lr={spec.min_lr:g}; set model.optim.sched.max_steps=null to follow the run"
        )
    tail = run_steps - spec.max_steps
    if tail > LONG_TAIL * run_steps:
        warnings.append(
            f"the decay ends long before the run: model.optim.sched.max_steps={spec.max_steps} <"
            f" trainer.max_steps={run_steps}, so the last {tail} steps run at min_lr={spec.min_lr:g};"
            " set model.optim.sched.max_steps=null to follow the run"
        )
    return warnings
