"""Learning-rate schedules with NeMo's names, as a pure function of the step.

`lr_at(step, spec)` is the closed form; `LRSchedule` applies it to an optimizer and
keeps only the step counter as state, so a resumed run gets exactly the same rates.
Steps count completed optimizer steps: step 0 is the first update, as NeMo's scheduler (its
`last_epoch` is 0 for the first iteration and moves after each optimizer step) and Megatron's.

The warmup follows nemo/core/optim/lr_scheduler.py: NeMo's CosineAnnealing takes Megatron's
warmup (lr x step / warmup, from 0) only when constant_steps > 0; with constant_steps 0 (the
`_improved` presets) it takes WarmupAnnealHoldPolicy's, lr x (step + 1) / (warmup + 1), whose first
step is already lr / (warmup + 1). The decay and the min_lr tail are the same in both branches.
`warmup_style: megatron` (set by `gptrain megatron`) keeps Megatron's warmup for every schedule.

Megatron can also count the schedule in samples (`--lr-warmup-samples`, `--lr-decay-samples`)
and NeMo in a ratio (`warmup_ratio`). With a constant global batch, Megatron's rate at
iteration i is its formula at i x batch samples, which is our formula with the phase lengths
divided by the batch: so those become fractional step counts here, and the rates are exact.

A resume with another model.global_batch_size: the checkpoint records the batch its steps count
in. A schedule in samples goes on from the samples it has seen (Megatron's scheduler counts
samples), so its step count is rescaled; one in steps (NeMo's) goes on at its step. Either way
the resume says so in one line.

A checkpoint also records the schedule's settings (`RECORDED`), so a resume whose config changed
them (a larger trainer.max_steps stretches the decay) can say so, with the rate before and after:
Megatron refuses such a change unless told which to take; here the config's applies, as in NeMo.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any

from gptrain.errors import ConfigError

if TYPE_CHECKING:
    from gptrain.config.schema import TrainingConfig

SCHEDULES = ("CosineAnnealing", "LinearAnnealing", "Constant")
WARMUP_STYLES = ("nemo", "megatron")


@dataclass(frozen=True)
class ScheduleSpec:
    """Everything the schedule depends on (from `model.optim` and `model.optim.sched`)."""

    name: str
    lr: float
    min_lr: float
    max_steps: float
    warmup_steps: float = 0
    constant_steps: float = 0
    warmup_init_lr: float = 0.0
    """The rate the linear warmup starts from (Megatron's --lr-warmup-init); NeMo's CosineAnnealing
    warmup (nemo_warmup) has none."""
    warmup_style: str = "nemo"
    global_batch_size: int = 0
    """The batch a step stands for (model.global_batch_size); 0: not known."""
    counts_samples: bool = False
    """The lengths were given in samples (decay_samples, warmup_samples), as Megatron's --lr-*-samples."""

    def __post_init__(self) -> None:
        if self.warmup_style not in WARMUP_STYLES:
            raise ConfigError(
                f"model.optim.sched.warmup_style={self.warmup_style!r} is not supported;"
                f" use one of {WARMUP_STYLES}"
            )
        if self.name not in SCHEDULES:
            raise ConfigError(
                f"model.optim.sched.name={self.name!r} is not supported; use one of {SCHEDULES}"
            )
        if self.name != "Constant" and self.min_lr > self.lr:
            raise ConfigError(
                f"model.optim.sched.min_lr={self.min_lr} is above model.optim.lr={self.lr}; lower min_lr"
            )
        if self.warmup_steps < 0 or self.constant_steps < 0:
            raise ConfigError("model.optim.sched.warmup_steps and constant_steps must be >= 0")
        if self.warmup_init_lr < 0:
            raise ConfigError(
                f"model.optim.sched.warmup_init_lr={self.warmup_init_lr} is negative; give a rate >= 0"
            )
        if self.warmup_init_lr and self.nemo_warmup:
            raise ConfigError(
                f"model.optim.sched.warmup_init_lr={self.warmup_init_lr}: NeMo's CosineAnnealing warmup without"
                " constant_steps starts at lr / (warmup_steps + 1), not at a rate of its own; set"
                " model.optim.sched.warmup_style=megatron to warm up from warmup_init_lr"
            )

    @property
    def decay_steps(self) -> float:
        """Steps of the decay phase: what remains after warmup and the final constant phase."""
        return max(0, self.max_steps - self.warmup_steps - self.constant_steps)

    @property
    def nemo_warmup(self) -> bool:
        """NeMo's CosineAnnealing without constant steps: warmup of WarmupAnnealHoldPolicy."""
        return self.warmup_style == "nemo" and self.name == "CosineAnnealing" and self.constant_steps == 0


def lr_at(step: int, spec: ScheduleSpec) -> float:
    """Learning rate for optimizer step `step` (0-based).

    Linear warmup to lr over warmup_steps (from warmup_init_lr, 0 by default, as Megatron's; or
    from lr / (warmup + 1) as NeMo's CosineAnnealing without constant steps), then decay from lr
    to min_lr over decay_steps (cosine or linear), then min_lr for the constant_steps and beyond;
    Constant holds lr after its warmup.
    """
    if spec.warmup_steps > 0 and step <= spec.warmup_steps:
        if spec.nemo_warmup:
            return spec.lr * (step + 1) / (spec.warmup_steps + 1)
        init = spec.warmup_init_lr
        return init + (spec.lr - init) * step / spec.warmup_steps
    if spec.name == "Constant":  # after the warmup, as Megatron's 'constant' decay style
        return spec.lr
    progress = step - spec.warmup_steps
    if spec.decay_steps == 0 or progress >= spec.decay_steps:
        return spec.min_lr
    ratio = progress / spec.decay_steps
    cosine = spec.name == "CosineAnnealing"
    coeff = 0.5 * (1.0 + math.cos(math.pi * ratio)) if cosine else 1.0 - ratio
    return spec.min_lr + coeff * (spec.lr - spec.min_lr)


# The ScheduleSpec fields a checkpoint records beside the step (global_batch_size: see state_dict).
RECORDED = (
    "name",
    "lr",
    "min_lr",
    "max_steps",
    "warmup_steps",
    "constant_steps",
    "warmup_style",
    "warmup_init_lr",
)
# Those a checkpoint from before them lacks, and the value such a checkpoint trained with.
RECORDED_LATER = {"warmup_init_lr": 0.0}


class LRSchedule:
    """Sets the rate of every param group before each step; `step` is its whole state (the
    settings saved beside it only tell a resume what changed)."""

    def __init__(self, optimizer: Any, spec: ScheduleSpec) -> None:
        self.optimizer = optimizer
        self.spec = spec
        self.step = 0
        self.resumed: tuple[ScheduleSpec, float] | None = None
        """The loaded checkpoint's schedule and step, where it recorded its settings."""

    def current_lr(self) -> float:
        return lr_at(self.step, self.spec)

    def apply(self) -> float:
        """Write the rate of the coming step into the optimizer; returns it."""
        lr = self.current_lr()
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        return lr

    def advance(self, fraction: float = 1.0) -> None:
        """One optimizer step; a batch-size ramp-up step of a fraction of the full batch moves less."""
        self.step = self.step + 1 if fraction == 1.0 else self.step + fraction

    def state_dict(self) -> dict[str, Any]:
        state: dict[str, Any] = {"step": self.step}
        if self.spec.global_batch_size:  # the unit of `step`, for a resume with another batch
            state["global_batch_size"] = self.spec.global_batch_size
        return state | {key: getattr(self.spec, key) for key in RECORDED}

    def load_state_dict(self, state: dict[str, Any]) -> str | None:
        """Take the saved step; with another global batch than the checkpoint's, a schedule in
        samples goes on from the same samples (rescaled step). Returns the line saying what changed."""
        step = _number(state["step"])
        self.step = step
        recorded = _recorded_spec(state)
        self.resumed = (recorded, step) if recorded is not None else None
        saved, batch = int(state.get("global_batch_size", 0)), self.spec.global_batch_size
        if not saved or not batch or saved == batch:
            return None
        changed = f"learning-rate schedule: model.global_batch_size={batch}, the checkpoint's was {saved}"
        if self.spec.counts_samples:
            self.step = _number(step * saved / batch)
            return (
                f"{changed}; the schedule counts samples (model.optim.sched.decay_samples/warmup_samples, as"
                f" Megatron's --lr-*-samples), so it goes on from the {_number(step * saved)} samples it has seen:"
                f" step {step} of {saved} samples is step {self.step} of {batch}"
            )
        return (
            f"{changed}; the schedule counts optimizer steps (NeMo's), so it goes on at step {step}, each step"
            f" now {batch} samples; to follow samples instead, give its lengths in samples"
            " (model.optim.sched.decay_samples, warmup_samples)"
        )


def _recorded_spec(state: dict[str, Any]) -> ScheduleSpec | None:
    """The schedule a checkpoint's state_dict records (its lengths in steps of its own batch); None
    for one from before the record, or one this version cannot rebuild (another version's schedule
    names): the comparison is only a note, and an error here would fail the load of a sound
    checkpoint, which the resume then takes for damaged."""
    if not all(key in state for key in RECORDED if key not in RECORDED_LATER):
        return None
    known = {f.name for f in fields(ScheduleSpec)}
    try:
        return ScheduleSpec(**RECORDED_LATER | {key: value for key, value in state.items() if key in known})
    except (ConfigError, TypeError, ValueError):
        return None


def _number(value: float) -> float:
    """An int when whole (the step of a run without ramp-up stays an int, as saved)."""
    return int(value) if float(value).is_integer() else float(value)


def spec_from_config(cfg: TrainingConfig) -> ScheduleSpec:
    """The schedule of `model.optim`, with sample counts and ratios turned into (fractional) steps.

    Megatron: `--lr-decay-samples S` is a schedule of S / global_batch_size steps,
    `--lr-warmup-fraction f` warms up over f x the schedule length. NeMo: `warmup_ratio r` warms
    up over int(r x max_steps) steps, `constant_ratio r` holds min_lr for int(r x max_steps) steps.
    NeMo reads a null warmup_steps or constant_steps as 0 (WarmupAnnealHoldPolicy), so do we.
    """
    optim, sched = cfg.model.optim, cfg.model.optim.sched
    batch = cfg.model.global_batch_size
    length: float = sched.max_steps or cfg.trainer.max_steps
    if sched.decay_samples is not None:
        length = sched.decay_samples / batch
    warmup: float = sched.warmup_steps or 0
    given = [
        k for k in ("warmup_ratio", "warmup_samples", "warmup_fraction") if getattr(sched, k) is not None
    ]
    if len(given) > 1 or (given and sched.warmup_steps):
        shown = ", ".join(
            f"model.optim.sched.{k}" for k in (["warmup_steps"] if sched.warmup_steps else []) + given
        )
        raise ConfigError(f"{shown}: give only one way of setting the warmup")
    if sched.warmup_samples is not None:
        warmup = sched.warmup_samples / batch
    elif sched.warmup_fraction is not None:
        warmup = sched.warmup_fraction * length
    elif sched.warmup_ratio is not None:
        warmup = int(sched.warmup_ratio * length)
    constant: float = sched.constant_steps or 0
    if sched.constant_ratio is not None:
        if sched.constant_steps:  # NeMo's WarmupAnnealHoldPolicy asserts not both; a 0 is absent, as
            # for warmup_steps: the presets and older hparams.yaml files carry `constant_steps: 0`
            raise ConfigError(
                f"model.optim.sched.constant_steps={sched.constant_steps} and"
                f" model.optim.sched.constant_ratio={sched.constant_ratio}: give only one"
                " (constant_steps=null to use the ratio)"
            )
        constant = int(sched.constant_ratio * length)
    return ScheduleSpec(
        name=sched.name,
        lr=optim.lr,
        min_lr=sched.min_lr,
        max_steps=length,
        warmup_steps=warmup,
        constant_steps=constant,
        warmup_init_lr=sched.warmup_init_lr,
        warmup_style=sched.warmup_style,
        global_batch_size=batch,
        counts_samples=sched.decay_samples is not None or sched.warmup_samples is not None,
    )
