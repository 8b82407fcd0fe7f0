"""Learning-rate schedules with NeMo's names, as a pure function of the step.

`lr_at(step, spec)` is the closed form; `LRSchedule` applies it to an optimizer and
keeps only the step counter as state, so a resumed run gets exactly the same rates.
Steps count completed optimizer steps: step 0 is the first update, as NeMo's scheduler (its
`last_epoch` is 0 for the first iteration and moves after each optimizer step) and Megatron's.

The warmup follows nemo/core/optim/lr_scheduler.py: NeMo's CosineAnnealing takes Megatron's
warmup (lr x step / warmup, from 0) only when constant_steps > 0; with constant_steps 0 (the
`_improved` presets) it takes WarmupAnnealHoldPolicy's, lr x (step + 1) / (warmup + 1), whose first
step is already lr / (warmup + 1), as do NeMo's WarmupPolicy schedules (nemo_schedules). The decay
and the min_lr tail are the same in both branches. `warmup_style: megatron` (set by `gptrain
megatron`) keeps Megatron's warmup for every schedule but NoamAnnealing, whose warmup is its own
(it refuses megatron and warmup_init_lr).

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

from gptrain.config.schema import default_min_lr
from gptrain.errors import ConfigError
from gptrain.train.megatron_schedules import (
    MEGATRON_SCHEDULES,
    WSD,
    WSD_ANNEALS,
    WSD_DEFAULT_ANNEAL,
    megatron_decay_lr,
)
from gptrain.train.nemo_schedules import (
    HOLD_POLICIES,
    NEMO_SCHEDULES,
    NOAM,
    OWN_DEFAULTS,
    OWN_KEYS,
    WARMUP_POLICIES,
    noam_lr,
    warmup_policy_lr,
)
from gptrain.train.weight_decay_schedule import (
    WeightDecaySpec,
    recorded_weight_decay,
    wd_at,
    weight_decay_record,
)

if TYPE_CHECKING:
    from gptrain.config.schema import TrainingConfig

SCHEDULES = ("CosineAnnealing", "LinearAnnealing", "Constant", *NEMO_SCHEDULES, *MEGATRON_SCHEDULES)
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
    hold_steps: float | None = None
    """NeMo's hold schedules: steps at lr after the warmup; None: no hold (NeMo's hold end is 0)."""
    d_model: float | None = None
    """NoamAnnealing's d_model."""
    power: float | None = None
    """The polynomial decays' exponent; None: NeMo's 1.0."""
    cycle: bool | None = None
    """The polynomial decays' cycle; None: NeMo's False."""
    decay_rate: float | None = None
    """NoamHoldAnnealing's exponent; None: NeMo's 0.5."""
    wsd_decay_steps: float | None = None
    """WarmupStableDecay's annealing, the last steps of max_steps (Megatron's --lr-wsd-decay-iters)."""
    wsd_decay_style: str | None = None
    """WarmupStableDecay's annealing shape (megatron_schedules.WSD_ANNEALS); None: Megatron's exponential."""

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
        self._check_nemo_keys()
        self._check_wsd_keys()
        if self.warmup_init_lr < 0:
            raise ConfigError(
                f"model.optim.sched.warmup_init_lr={self.warmup_init_lr} is negative; give a rate >= 0"
            )
        if self.warmup_init_lr and self.nemo_warmup:
            which = "warmup without constant_steps" if self.name == "CosineAnnealing" else "warmup"
            raise ConfigError(
                f"model.optim.sched.warmup_init_lr={self.warmup_init_lr}: NeMo's {self.name} {which}"
                " starts at lr / (warmup_steps + 1), not at a rate of its own; set"
                " model.optim.sched.warmup_style=megatron to warm up from warmup_init_lr"
            )

    def _check_nemo_keys(self) -> None:
        """The keys of NeMo's other schedules: each only where its schedule takes it (NeMo's
        constructors refuse the others), with a value it can take."""
        for key, takers in OWN_KEYS.items():
            value = getattr(self, key, None)
            if value is not None and self.name not in takers:
                raise ConfigError(
                    f"model.optim.sched.{key}={value}: {self.name} does not take it (NeMo's"
                    f" {', '.join(takers)} do); remove it or set it to null"
                )
        if self.d_model is not None and not self.d_model > 0:  # d_model ** -0.5
            raise ConfigError(f"model.optim.sched.d_model={self.d_model}: must be above 0")
        exponents = {"power": self.power, "decay_rate": self.decay_rate}  # 0: lr to max_steps (x ** 0 is 1)
        for key, value in exponents.items():
            if value is not None and not value >= 0:  # a negative one divides by 0 at the decay's end
                raise ConfigError(f"model.optim.sched.{key}={value}: must be 0 or more")
        if self.hold_steps is not None and self.hold_steps < 0:
            raise ConfigError(f"model.optim.sched.hold_steps={self.hold_steps}: must be 0 or more")
        if self.name in (*NEMO_SCHEDULES, *MEGATRON_SCHEDULES) and self.constant_steps:
            raise ConfigError(
                f"model.optim.sched.constant_steps={_number(self.constant_steps)}: {self.name} has no constant"
                " phase (only CosineAnnealing and LinearAnnealing hold min_lr at the end); set it to 0 or null"
            )
        if self.name == NOAM and self.d_model is None:
            raise ConfigError("model.optim.sched.d_model: NoamAnnealing needs it; give the model width")
        if self.name == NOAM and self.warmup_init_lr:  # under either style: its warmup is its own
            raise ConfigError(
                f"model.optim.sched.warmup_init_lr={self.warmup_init_lr}: NoamAnnealing takes no"
                " warmup_init_lr; remove it"
            )
        if self.name == NOAM and self.warmup_style == "megatron":
            raise ConfigError(
                "model.optim.sched.warmup_style=megatron: NoamAnnealing's warmup is its own"
                " (lr x d_model ** -0.5 x step x warmup ** -1.5); set warmup_style=nemo"
            )
        if self.name == "NoamHoldAnnealing" and not self.warmup_steps:
            raise ConfigError(
                "model.optim.sched.warmup_steps: NoamHoldAnnealing needs a warmup (NeMo refuses it without"
                " one); give warmup_steps or warmup_ratio"
            )

    def _check_wsd_keys(self) -> None:
        """WarmupStableDecay's keys, only with it; its annealing's length, which Megatron asserts."""
        if self.name != WSD:
            given = [
                (key, value)
                for key in ("wsd_decay_steps", "wsd_decay_style")
                if (value := getattr(self, key)) is not None  # a 0 too: it would be silently unused
            ]
            if given:
                raise ConfigError(
                    f"model.optim.sched.{given[0][0]}={given[0][1]}: only WarmupStableDecay (Megatron's WSD) takes"
                    " it; remove it or set it to null"
                )
            return
        if self.wsd_decay_steps is None:
            raise ConfigError(
                "model.optim.sched.wsd_decay_steps: WarmupStableDecay needs the length of its annealing"
                " (Megatron asserts it); give wsd_decay_steps or wsd_decay_samples"
            )
        if not self.wsd_decay_steps >= 0:
            raise ConfigError(f"model.optim.sched.wsd_decay_steps={self.wsd_decay_steps}: must be 0 or more")
        if self.wsd_decay_style is not None and self.wsd_decay_style not in WSD_ANNEALS:
            raise ConfigError(
                f"model.optim.sched.wsd_decay_style={self.wsd_decay_style!r} is not supported; use one of"
                f" {', '.join(WSD_ANNEALS)} (null: {WSD_DEFAULT_ANNEAL}, Megatron's default)"
            )

    @property
    def decay_steps(self) -> float:
        """Steps of the decay phase: what remains after warmup and the final constant phase."""
        return max(0, self.max_steps - self.warmup_steps - self.constant_steps)

    @property
    def nemo_warmup(self) -> bool:
        """NeMo's warmup from lr / (warmup + 1): CosineAnnealing without constant steps (that of
        WarmupAnnealHoldPolicy) and NeMo's WarmupPolicy schedules; Noam's is its own."""
        if self.warmup_style != "nemo":
            return False
        cosine = self.name == "CosineAnnealing" and self.constant_steps == 0
        return cosine or self.name in WARMUP_POLICIES or self.name == NOAM

    @property
    def decay_power(self) -> float:
        return OWN_DEFAULTS["power"] if self.power is None else self.power

    @property
    def decay_cycle(self) -> bool:
        return bool(OWN_DEFAULTS["cycle"] if self.cycle is None else self.cycle)

    @property
    def noam_decay_rate(self) -> float:
        return OWN_DEFAULTS["decay_rate"] if self.decay_rate is None else self.decay_rate


def lr_at(step: int, spec: ScheduleSpec) -> float:
    """Learning rate for optimizer step `step` (0-based).

    Linear warmup to lr over warmup_steps (from warmup_init_lr, 0 by default, as Megatron's; or
    from lr / (warmup + 1) as NeMo's CosineAnnealing without constant steps), then decay from lr
    to min_lr over decay_steps (cosine or linear), then min_lr for the constant_steps and beyond;
    Constant holds lr after its warmup. NeMo's other schedules: gptrain.train.nemo_schedules.
    """
    if spec.name in WARMUP_POLICIES:
        return warmup_policy_lr(step, spec)
    if spec.name == NOAM:
        return noam_lr(step, spec)
    if spec.warmup_steps > 0 and step <= spec.warmup_steps:
        if spec.nemo_warmup:
            return spec.lr * (step + 1) / (spec.warmup_steps + 1)
        init = spec.warmup_init_lr
        return init + (spec.lr - init) * step / spec.warmup_steps
    if spec.name == "Constant":  # after the warmup, as Megatron's 'constant' decay style
        return spec.lr
    if spec.name in MEGATRON_SCHEDULES:
        return megatron_decay_lr(step, spec)
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
# The keys of NeMo's other schedules, recorded where set (a checkpoint of the others is as before).
RECORDED_WHERE_SET = (
    "hold_steps",
    "d_model",
    "power",
    "cycle",
    "decay_rate",
    "wsd_decay_steps",
    "wsd_decay_style",
)
# Those a checkpoint from before them lacks, and the value such a checkpoint trained with.
RECORDED_LATER = {"warmup_init_lr": 0.0} | dict.fromkeys(RECORDED_WHERE_SET)


class LRSchedule:
    """Sets the rate of every param group before each step; `step` is its whole state (the
    settings saved beside it only tell a resume what changed)."""

    def __init__(
        self, optimizer: Any, spec: ScheduleSpec, weight_decay: WeightDecaySpec | None = None
    ) -> None:
        self.optimizer = optimizer
        self.spec = spec
        self.step = 0
        self.resumed: tuple[ScheduleSpec, float] | None = None
        """The loaded checkpoint's schedule and step, where it recorded its settings."""
        self.weight_decay = weight_decay
        """Megatron's weight-decay increment, set before each step with the rate; None: constant."""
        self.resumed_weight_decay: tuple[WeightDecaySpec, float, int] | None = None
        """The loaded checkpoint's weight decay, step and batch, where it recorded the decay."""
        self.decayed = decaying_groups(optimizer) if weight_decay is not None else []
        """The groups that decay; by index, as a load replaces them."""

    def trained_weight_decay(self) -> WeightDecaySpec | None:
        """The weight decay this schedule trains with: the increment, or a constant one at the decaying
        groups' value (the largest); None without an optimizer's groups to read it from."""
        if self.weight_decay is not None:
            return self.weight_decay
        decays = [group.get("weight_decay") for group in getattr(self.optimizer, "param_groups", [])]
        if not decays or None in decays:
            return None
        return WeightDecaySpec("constant", max(decays), max(decays), 0)

    def current_lr(self) -> float:
        return lr_at(self.step, self.spec)

    def apply(self) -> float:
        """Write the rate of the coming step into the optimizer; returns it."""
        lr = self.current_lr()
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        if self.weight_decay is not None:
            for index in self.decayed:
                self.optimizer.param_groups[index]["weight_decay"] = wd_at(self.step, self.weight_decay)
        return lr

    def advance(self, fraction: float = 1.0) -> None:
        """One optimizer step; a batch-size ramp-up step of a fraction of the full batch moves less.
        The step stays a whole count of samples over the batch (k / batch, as a length in samples is):
        a sum of fractions would cross a boundary in samples one iteration early by float error,
        where Megatron compares whole samples."""
        step, batch = self.step + (1 if fraction == 1.0 else fraction), self.spec.global_batch_size
        self.step = step if isinstance(step, int) or not batch else _number(round(step * batch) / batch)

    def state_dict(self) -> dict[str, Any]:
        state: dict[str, Any] = {"step": self.step}
        if self.spec.global_batch_size:  # the unit of `step`, for a resume with another batch
            state["global_batch_size"] = self.spec.global_batch_size
        state |= {key: getattr(self.spec, key) for key in RECORDED}
        if (weight_decay := self.trained_weight_decay()) is not None:
            state |= weight_decay_record(weight_decay)
        return state | {
            key: value for key in RECORDED_WHERE_SET if (value := getattr(self.spec, key)) is not None
        }

    def load_state_dict(self, state: dict[str, Any]) -> str | None:
        """Take the saved step; with another global batch than the checkpoint's, a schedule in
        samples goes on from the same samples (rescaled step). Returns the line saying what changed."""
        step = _number(state["step"])
        self.step = step
        recorded = _recorded_spec(state)
        self.resumed = (recorded, step) if recorded is not None else None
        weight_decay = recorded_weight_decay(state)
        batch_then = int(state.get("global_batch_size", 0))
        self.resumed_weight_decay = (weight_decay, step, batch_then) if weight_decay is not None else None
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


def decaying_groups(optimizer: Any) -> list[int]:
    """The param groups that decay: those with a decay above 0 (an increment's are built at its end) or a
    parameter of 2 or more dimensions (optim.param_groups keeps the 1-D ones apart, undecayed), so a
    run built with a constant 0 that takes a checkpoint's increment finds its matrices."""
    return [
        index
        for index, group in enumerate(optimizer.param_groups)
        if group.get("weight_decay") or any(param.ndim >= 2 for param in group.get("params", []))
    ]


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
    NeMo reads a null warmup_steps or constant_steps as 0 (WarmupAnnealHoldPolicy), so do we;
    `hold_ratio r` holds int(r x max_steps) steps, and NoamAnnealing's d_model defaults to the model's width.
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
        min_lr=default_min_lr(sched.name) if sched.min_lr is None else sched.min_lr,
        max_steps=length,
        warmup_steps=warmup,
        constant_steps=constant,
        warmup_init_lr=sched.warmup_init_lr,
        warmup_style=sched.warmup_style,
        global_batch_size=batch,
        counts_samples=any(
            value is not None
            for value in (sched.decay_samples, sched.warmup_samples, sched.wsd_decay_samples)
        ),
        hold_steps=_hold_steps(sched, length),
        d_model=cfg.model.hidden_size if sched.d_model is None and sched.name == NOAM else sched.d_model,
        power=sched.power,
        cycle=sched.cycle,
        decay_rate=sched.decay_rate,
        wsd_decay_steps=_wsd_decay_steps(sched, batch),
        wsd_decay_style=WSD_DEFAULT_ANNEAL
        if sched.name == WSD and sched.wsd_decay_style is None
        else sched.wsd_decay_style,
    )


def _wsd_decay_steps(sched: Any, batch: int) -> float | None:
    """WarmupStableDecay's annealing in steps: wsd_decay_steps, or wsd_decay_samples / batch; not both."""
    if sched.wsd_decay_samples is None:
        return sched.wsd_decay_steps
    if sched.name != WSD:
        raise ConfigError(
            f"model.optim.sched.wsd_decay_samples={sched.wsd_decay_samples}: only WarmupStableDecay (Megatron's"
            " WSD) takes it; remove it or set it to null"
        )
    if sched.wsd_decay_steps is not None:
        raise ConfigError(
            f"model.optim.sched.wsd_decay_steps={sched.wsd_decay_steps} and model.optim.sched.wsd_decay_samples="
            f"{sched.wsd_decay_samples}: give only one"
        )
    return sched.wsd_decay_samples / batch


def _hold_steps(sched: Any, length: float) -> float | None:
    """NeMo's hold: hold_steps, or int(hold_ratio x schedule length); not both (NeMo asserts)."""
    if sched.hold_ratio is None:
        return sched.hold_steps
    if sched.hold_steps is not None:
        raise ConfigError(
            f"model.optim.sched.hold_steps={sched.hold_steps} and model.optim.sched.hold_ratio="
            f"{sched.hold_ratio}: give only one"
        )
    if sched.name not in HOLD_POLICIES:
        raise ConfigError(
            f"model.optim.sched.hold_ratio={sched.hold_ratio}: {sched.name} does not take it (NeMo's"
            f" {', '.join(HOLD_POLICIES)} do); remove it or set it to null"
        )
    return int(sched.hold_ratio * length)
