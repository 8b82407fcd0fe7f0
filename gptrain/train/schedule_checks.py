"""Warnings, at start, for a learning-rate schedule that cannot happen as written.

A preset's warmup (e.g. gpt3/126m's 636 steps) longer than a short test run means the rate
never reaches `model.optim.lr`, and a schedule length (`model.optim.sched.max_steps`,
`decay_samples`) other than the run's length stops the decay early or leaves most of the run at
min_lr. None of this is wrong for every purpose, so these are warnings, not errors; min_lr above
lr is an error (ScheduleSpec refuses it).

The schedule counts steps of the full global batch: a batch-size ramp-up's smaller batches move it
by their share (Megatron counts it in samples), so where it stands at an iteration is the samples
consumed by then over the full batch, not the iteration itself.

Each warning names the settings as the user gave them (ScheduleNames): the key that set a length
(decay_samples, warmup_samples, ...), or under `gptrain megatron` the flags.

At a resume, `resumed_schedule_change` is the line for a schedule the config changed since the
checkpoint (its settings are recorded there): not wrong either, but a jump of the rate is never silent.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from gptrain.train.megatron_schedules import INVERSE_SQUARE_ROOT, WSD
from gptrain.train.nemo_schedules import NOAM, NOT_TO_MIN_LR, own_key_value
from gptrain.train.rampup import BatchRamp
from gptrain.train.schedule import RECORDED_WHERE_SET, LRSchedule, ScheduleSpec, lr_at

if TYPE_CHECKING:
    from gptrain.config.schema import TrainingConfig

# The run may spend this fraction of its steps at min_lr after the schedule ended before we warn.
LONG_TAIL = 0.1


@dataclass(frozen=True)
class ScheduleNames:
    """The settings the start warnings name, as the user gave them: advice about a key the run does
    not use changes nothing. `run`, `decay` and `warmup` are a setting with its value (and its steps
    where it counts samples); `follow_run` says how to make the decay end with the run. The config's
    keys by default (names_in_config); `gptrain megatron` names its flags (Translation.schedule_names)."""

    run: str
    decay: str
    warmup: str
    follow_run: str
    constant: str = ""
    """` + model.optim.sched.constant_steps=N` where the schedule holds min_lr for N steps, else empty."""
    run_key: str = "trainer.max_steps"
    warmup_key: str = "model.optim.sched.warmup_steps"
    lr: str = "model.optim.lr="
    min_lr: str = "min_lr="
    unit: str = "steps"
    settings: Mapping[str, str] = field(default_factory=dict)
    """The name of each schedule key the user set otherwise (`trainer.max_steps` -> `--train-iters`),
    for the line at a resume; a key not in it is named as it is."""
    wsd_decay: str = "model.optim.sched.wsd_decay_steps"
    """WarmupStableDecay's annealing, its setting with its value."""
    values: Mapping[str, Mapping[str, str]] = field(default_factory=dict)
    """How the user spells a key's values where that differs (`--lr-decay-style`: CosineAnnealing is
    `cosine`), for the same line."""
    own_schedule: str = "set model.optim.sched.from_checkpoint=false"
    """How a resume follows this config's schedule, not the one its checkpoint records: the keys
    `follow_run` names change nothing before that (following_this_config)."""


def following_this_config(names: ScheduleNames) -> ScheduleNames:
    """`names` for a schedule a resume took from its checkpoint (model.optim.sched.from_checkpoint):
    advice to set model.optim.sched.max_steps=null alone had no effect, the checkpoint's length stays."""
    own, follow = names.own_schedule, names.follow_run
    if own.startswith("set ") and follow.startswith("set "):
        return replace(names, follow_run=f"{own} and {follow.removeprefix('set ')}")
    return replace(names, follow_run=f"{own}, then {follow}")


def run_schedule_warnings(
    cfg: TrainingConfig, spec: ScheduleSpec, names: ScheduleNames | None = None
) -> list[str]:
    """schedule_warnings for the run `cfg` configures: its ramp-up, and its settings named by `names`
    (names_in_config without it)."""
    ramp = config_ramp(cfg)
    return schedule_warnings(spec, cfg.trainer.max_steps, ramp, names or names_in_config(cfg, spec))


def config_ramp(cfg: TrainingConfig) -> BatchRamp:
    """The ramp's batch sizes (their split into micro-batches is checked with the layout)."""
    m = cfg.model
    return BatchRamp.from_config(m.rampup_batch_size, m.global_batch_size, 1)


def names_in_steps(spec: ScheduleSpec, run_steps: int, ramp: BatchRamp) -> ScheduleNames:
    """The names of a schedule given in steps (model.optim.sched.max_steps, warmup_steps)."""
    return ScheduleNames(
        run=f"trainer.max_steps={run_steps}",
        decay=f"model.optim.sched.max_steps={shown_steps(spec.max_steps)}",
        warmup=f"model.optim.sched.warmup_steps={shown_steps(spec.warmup_steps)}",
        wsd_decay=f"model.optim.sched.wsd_decay_steps={shown_steps(spec.wsd_decay_steps or 0)}",
        constant=f" + model.optim.sched.constant_steps={shown_steps(spec.constant_steps)}"
        if spec.constant_steps
        else "",
        follow_run=_follow_in_samples(ramp, run_steps)
        if ramp.start is not None
        else "set model.optim.sched.max_steps=null to follow the run",
    )


def names_in_config(cfg: TrainingConfig, spec: ScheduleSpec) -> ScheduleNames:
    """The names of `cfg`'s schedule: the key that set its length (decay_samples, or a null max_steps:
    trainer.max_steps) and its warmup (warmup_samples, _fraction, _ratio), with their steps."""
    sched, prefix = cfg.model.optim.sched, "model.optim.sched."
    run_steps, ramp = cfg.trainer.max_steps, config_ramp(cfg)
    names = names_in_steps(spec, run_steps, ramp)
    if sched.decay_samples is not None:
        decay = (
            f"{prefix}decay_samples={sched.decay_samples} (a schedule of {shown_steps(spec.max_steps)} steps)"
        )
        names = replace(names, decay=decay, follow_run=_follow_in_samples(ramp, run_steps))
    elif sched.max_steps is None:
        decay = (
            f"{prefix}max_steps=null (a schedule of trainer.max_steps, {shown_steps(spec.max_steps)} steps)"
        )
        names = replace(names, decay=decay)
    if sched.wsd_decay_samples is not None:
        wsd_decay = f"{prefix}wsd_decay_samples={sched.wsd_decay_samples} ({shown_steps(spec.wsd_decay_steps or 0)} steps)"
        names = replace(names, wsd_decay=wsd_decay)
    warmup_key = next((key for key in WARMUP_KEYS if getattr(sched, key) is not None), None)
    if warmup_key is not None:
        value = getattr(sched, warmup_key)
        warmup = f"{prefix}{warmup_key}={value} ({shown_steps(spec.warmup_steps)} steps)"
        names = replace(names, warmup=warmup, warmup_key=prefix + warmup_key)
    elif sched.decay_samples is not None:  # a warmup to give is in samples too
        names = replace(names, warmup_key=f"{prefix}warmup_samples")
    if sched.constant_ratio is not None and spec.constant_steps:
        constant = (
            f" + {prefix}constant_ratio={sched.constant_ratio} ({shown_steps(spec.constant_steps)} steps)"
        )
        names = replace(names, constant=constant)
    return names


# The keys that set the warmup other than in steps (spec_from_config takes one of them).
WARMUP_KEYS = ("warmup_samples", "warmup_fraction", "warmup_ratio")


def _follow_in_samples(ramp: BatchRamp, run_steps: int) -> str:
    """A length in samples follows the run, whatever its ramp-up, when it is the samples it consumes."""
    samples = ramp.samples_for(run_steps)
    return f"set model.optim.sched.decay_samples={samples} (the samples the run consumes) to follow the run"


def schedule_warnings(
    spec: ScheduleSpec, run_steps: int, ramp: BatchRamp | None = None, names: ScheduleNames | None = None
) -> list[str]:
    """One line per problem of `spec` for a run of `run_steps` optimizer steps (trainer.max_steps)
    under `ramp`, its settings named by `names` (names_in_steps without it)."""
    if run_steps <= 0:
        return []
    ramp = ramp or BatchRamp(spec.global_batch_size or 1)
    n = names or names_in_steps(spec, run_steps, ramp)
    warnings = []
    last = schedule_position(ramp, run_steps - 1)  # where the run's last step takes its rate
    if spec.warmup_steps > last and spec.name != NOAM:  # Noam's peak is not lr
        warnings.append(
            f"{n.warmup} is not shorter than {n.run}: the learning rate never reaches {n.lr}{spec.lr:g}"
            f" (at most {lr_at(last, spec):.3g}); lower {n.warmup_key} or raise {n.run_key}"
        )
    warnings += _megatron_schedule_warnings(spec, n, ramp.at(0))
    no_length = spec.name in ("Constant", NOAM)  # Noam decays as step ** -0.5 for ever
    if no_length or spec.warmup_steps > last:  # no decay to check, or none reached
        return warnings
    if spec.warmup_steps + spec.constant_steps >= spec.max_steps:
        warnings.append(
            f"{n.warmup}{n.constant} leaves no decay in {n.decay}: the rate drops from"
            f" {spec.lr:g} to {n.min_lr}{spec.min_lr:g} at once after warmup"
        )
    return warnings + _length_warnings(spec, run_steps, ramp, n)


def _megatron_schedule_warnings(spec: ScheduleSpec, n: ScheduleNames, first_batch: int) -> list[str]:
    """Megatron's quirks, kept: its inverse square root counts from one sample, so without a warmup
    the rate falls by sqrt(first batch) after the first step (a ramp's first batch, else the global
    batch); a WSD annealing longer than the decay after the warmup starts within it, so the rate
    steps down when the warmup ends."""
    batch = spec.global_batch_size or 1
    if spec.name == INVERSE_SQUARE_ROOT and spec.warmup_steps * batch <= 1 < first_batch:
        which = "the global batch" if first_batch == batch else "the ramp-up's first batch"
        return [
            f"{n.warmup}: Megatron's inverse square root without a warmup is lr / sqrt(samples consumed), so"
            f" the rate falls from {spec.lr:g} to {lr_at(first_batch / batch, spec):.3g} (/ sqrt({first_batch}),"
            f" {which}) after the first step; give a warmup ({n.warmup_key}) for a gradual decay"
        ]
    annealing = spec.wsd_decay_steps or 0
    if spec.name == WSD and spec.warmup_steps > 0 and annealing > spec.max_steps - spec.warmup_steps:
        return [
            f"{n.wsd_decay} is longer than {n.decay} after {n.warmup}: the annealing starts within the warmup,"
            f" so the rate steps down from {spec.lr:g} to {lr_at(math.floor(spec.warmup_steps) + 1, spec):.3g}"
            " when the warmup ends, as in Megatron; give a shorter annealing"
        ]
    return []


def _length_warnings(spec: ScheduleSpec, run_steps: int, ramp: BatchRamp, n: ScheduleNames) -> list[str]:
    """The decay ending after the run, or long before it, counted where the schedule stands."""
    end = schedule_position(ramp, run_steps)
    run = n.run
    if ramp.start is not None:
        run += f", {shown_steps(end)} {n.unit} of the full batch under its ramp-up's smaller ones"
    ends_at_min_lr = spec.name not in (
        *NOT_TO_MIN_LR,
        INVERSE_SQUARE_ROOT,
    )  # its min_lr comes after max_steps
    last_rate = lr_at(schedule_position(ramp, run_steps - 1), spec)
    # A floor (SquareAnnealing's, a decay from step 0) may reach min_lr before max_steps: nothing is left.
    unfinished = ends_at_min_lr and last_rate > spec.min_lr
    if spec.max_steps - end >= 1 and unfinished:  # less: the partial last batch a run in samples leaves
        return [
            f"the decay ends after the run: {n.decay} > {run}, so the last rate is {last_rate:.3g}, not"
            f" {n.min_lr}{spec.min_lr:g}; {n.follow_run}"
        ]
    tail = run_steps - ramp.iterations_to_consume(spec.max_steps * ramp.global_batch_size)
    if tail > LONG_TAIL * run_steps:
        return [
            f"the decay ends long before the run: {n.decay} < {run}, so the last {tail} {n.unit} run at"
            f" {n.min_lr}{spec.min_lr:g}; {n.follow_run}"
        ]
    return []


def schedule_position(ramp: BatchRamp, iterations: int) -> float:
    """Steps of the full global batch the schedule has moved after `iterations` updates."""
    return ramp.samples_for(iterations) / ramp.global_batch_size


def shown_steps(value: float) -> str:
    """A step count as written: whole ones as integers, a fraction (a length in samples) to 2 places."""
    return str(int(value)) if float(value).is_integer() else f"{value:.2f}"


def resumed_schedule_change(
    cfg: TrainingConfig, schedule: LRSchedule, iteration: int, names: ScheduleNames | None = None
) -> str | None:
    """One line naming each schedule setting this run's config changed since the checkpoint `schedule`
    was loaded from (old -> new), and the learning rate of the coming `iteration` by each schedule:
    a raised trainer.max_steps stretches the decay, and the rate jumps. None when nothing changed,
    or the checkpoint (from before they were recorded) holds no settings. The settings are named by
    `names.settings` (the flags under `gptrain megatron`), else by the config's keys."""
    if schedule.resumed is None:
        return None
    old, saved_step = schedule.resumed
    settings = names.settings if names is not None else {}
    values = names.values if names is not None else {}
    changes = [
        f"{key} {shown(before)} -> {shown(after)}"
        for key, before, after, shown in _recorded_settings(cfg, old, schedule.spec, settings, values)
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


def _recorded_settings(
    cfg: TrainingConfig,
    old: ScheduleSpec,
    new: ScheduleSpec,
    settings: Mapping[str, str],
    values: Mapping[str, Mapping[str, str]] = {},  # noqa: B006  (read only)
) -> list[Setting]:
    """(the name of what sets it in `cfg`, the checkpoint's value, this run's, how to show one) for
    each setting a checkpoint records, a key named by `settings` where it has a name there; a length
    set in samples (decay_samples, warmup_samples) is compared in samples, as Megatron counts it; a key
    of NeMo's other schedules only where its resolved values differ (a null is NeMo's default: writing
    out power=1.0 changes no rate)."""
    sched, prefix = cfg.model.optim.sched, "model.optim.sched."

    def name(key: str) -> str:
        return settings.get(key, key)

    if sched.decay_samples is not None:
        length = f"{prefix}decay_samples"
    else:
        length = f"{prefix}max_steps" if sched.max_steps else "trainer.max_steps"
    warmup_key = next(
        (key for key in reversed(WARMUP_KEYS) if getattr(sched, key) is not None), "warmup_steps"
    )
    warmup = name(prefix + warmup_key)
    if warmup_key in ("warmup_fraction", "warmup_ratio"):  # the steps they make are compared
        warmup = f"warmup steps ({warmup})"
    constant = name(f"{prefix}constant_steps")
    if sched.constant_ratio is not None:
        constant = f"constant steps ({name(prefix + 'constant_ratio')})"

    def length_of(attribute: str, key: str, in_samples: bool) -> Setting:
        before, after = getattr(old, attribute), getattr(new, attribute)
        if in_samples and old.global_batch_size:
            before, after = before * old.global_batch_size, after * new.global_batch_size
        return key, before, after, shown_steps

    return [
        (name(f"{prefix}name"), old.name, new.name, lambda v: values.get(f"{prefix}name", {}).get(v, str(v))),
        (name("model.optim.lr"), old.lr, new.lr, "{:g}".format),
        (name(f"{prefix}min_lr"), old.min_lr, new.min_lr, "{:g}".format),
        length_of("max_steps", name(length), length.endswith("_samples")),
        length_of("warmup_steps", warmup, warmup_key == "warmup_samples"),
        length_of("constant_steps", constant, False),
        (name(f"{prefix}warmup_style"), old.warmup_style, new.warmup_style, str),
        (name(f"{prefix}warmup_init_lr"), old.warmup_init_lr, new.warmup_init_lr, "{:g}".format),
        *[
            (name(f"{prefix}{key}"), getattr(old, key), getattr(new, key), _shown)
            for key in RECORDED_WHERE_SET
            if key != "wsd_decay_steps" and not _same(own_key_value(old, key), own_key_value(new, key))
        ],
        *_wsd_length(old, new, sched.wsd_decay_samples is not None, name),
    ]


def _wsd_length(
    old: ScheduleSpec, new: ScheduleSpec, in_samples: bool, name: Callable[[str], str]
) -> list[Setting]:
    """WarmupStableDecay's annealing, in samples where set in samples (as the decay's length)."""
    before, after = old.wsd_decay_steps, new.wsd_decay_steps
    key = "model.optim.sched.wsd_decay_" + ("samples" if in_samples else "steps")
    if before is None or after is None:
        return [] if before is after else [(name(key), before, after, _shown)]
    if in_samples and old.global_batch_size:
        before, after = before * old.global_batch_size, after * new.global_batch_size
    return [(name(key), before, after, shown_steps)]


def _shown(value: Any) -> str:
    """A recorded setting as the config writes it (null where not set)."""
    if value is None or isinstance(value, bool):
        return "null" if value is None else str(value).lower()
    return value if isinstance(value, str) else f"{value:g}"


def _same(before: Any, after: Any) -> bool:
    """Equal, or for numbers equal up to rounding (a length in samples goes through steps)."""
    if not isinstance(before, int | float) or not isinstance(after, int | float):
        return before == after
    return math.isclose(before, after, rel_tol=1e-9, abs_tol=1e-12)
