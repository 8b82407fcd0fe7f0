"""Run length, batch schedule and learning-rate schedule flags, which Megatron asserts together."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from gptrain.errors import ConfigError
from gptrain.megatron import batch_schedule
from gptrain.megatron.defaults import MEGATRON_DEFAULTS, WARMUP_FLAGS
from gptrain.megatron.flag_parsing import convert_value
from gptrain.train.rampup import BatchRamp

if TYPE_CHECKING:
    from gptrain.megatron.translation import Translation


def decoupled_lr(result: Translation) -> None:
    """Megatron's --decoupled-lr (and --decoupled-min-lr, read only beside it) give the embedding and
    output layers a schedule of their own; gptrain has one for every weight, so only the values of
    --lr and --min-lr are taken, and any other is refused saying what it would change."""
    given, v = result.given, result.values
    if "--decoupled-lr" not in given:
        if "--decoupled-min-lr" in given:
            result.notes.append("--decoupled-min-lr (Megatron reads it only with --decoupled-lr)")
        return
    lr, min_lr = v["model.optim.lr"], v["model.optim.sched.min_lr"]
    peak = convert_value("--decoupled-lr", given["--decoupled-lr"][0], float)
    floor = convert_value("--decoupled-min-lr", (given.get("--decoupled-min-lr") or [str(min_lr)])[0], float)
    if (peak, floor) != (lr, min_lr):
        raise ConfigError(
            f"--decoupled-lr {peak} (--decoupled-min-lr {floor}): a learning rate of their own for the "
            f"embedding and output layers, where the other weights take --lr {lr} (--min-lr {min_lr}), is "
            "not implemented; drop --decoupled-lr and --decoupled-min-lr to train them at --lr"
        )
    result.notes.append("--decoupled-lr (the same as --lr and --min-lr)")
    if "--decoupled-min-lr" in given:
        result.notes.append("--decoupled-min-lr (the same as --min-lr)")


def _parsed_schedule(v: dict[str, Any], given: dict[str, list[str]]) -> list[tuple[int, int]] | None:
    """The schedule's words joined: Megatron's example expands its array unquoted, one word per entry."""
    words = given.get(batch_schedule.FLAG)
    return (
        None
        if words is None
        else batch_schedule.parse_schedule(" ".join(words), v["model.encoder_seq_length"])
    )


def step_batch_schedule(result: Translation) -> None:
    """--step-batch-size-schedule: the global batch is its last batch size, and a schedule of equal
    steps is Megatron's linear ramp. Megatron refuses --global-batch-size beside it, yet its own 175B
    example gives both: the same size is taken (said), another is refused."""
    v, given, flag = result.values, result.given, batch_schedule.FLAG
    schedule = _parsed_schedule(v, given)
    if schedule is None:
        return
    if "--rampup-batch-size" in given:
        raise ConfigError(
            f"{flag} and --rampup-batch-size: give one (Megatron ignores --rampup-batch-size now)"
        )
    text, last = " ".join(given[flag]), schedule[-1][1]
    if "--global-batch-size" in given:
        if v["model.global_batch_size"] != last:
            raise ConfigError(
                f"--global-batch-size {v['model.global_batch_size']} and {flag} '{text}' (last batch {last}): "
                "drop --global-batch-size, as Megatron refuses the pair"
            )
        result.notes.append(f"--global-batch-size (the last batch of {flag}; Megatron refuses the pair)")
    elif "--train-iters" in given:
        result.notes.append(
            f"{flag} with --train-iters (the --lr-*-iters schedule counts batches of the last size, {last}; "
            "Megatron without --global-batch-size counts batches of micro-batch x data-parallel size)"
        )
    v["model.global_batch_size"] = last
    ramp = batch_schedule.as_ramp(schedule, text)
    if ramp is not None:
        v["model.rampup_batch_size"] = ramp
        if batch_schedule.floored_steps(schedule):
            result.notes.append(
                f"{flag} (its token thresholds floored to samples are not evenly spaced: each batch "
                "step comes at most one sample after Megatron's)"
            )


# WSD's annealing flags, the key each sets, and the run's length flag each goes with.
WSD_LENGTHS = {
    "--lr-wsd-decay-iters": ("model.optim.sched.wsd_decay_steps", "--train-iters"),
    "--lr-wsd-decay-samples": ("model.optim.sched.wsd_decay_samples", "--train-samples"),
}


def megatron_decay_styles(result: Translation) -> None:
    """--lr-decay-style WSD takes its annealing's length in the run's unit, as Megatron's scheduler
    does: without it Megatron asserts, and the flag of the other unit it ignores (said here). The
    --lr-wsd-* flags beside another style Megatron ignores too. After iteration_flags (the run's unit)."""
    v, given = result.values, result.given
    wsd_flags = [*WSD_LENGTHS, "--lr-wsd-decay-style"]
    if v["model.optim.sched.name"] != "WarmupStableDecay":
        for flag in (flag for flag in wsd_flags if flag in given):
            v.pop(WSD_LENGTHS.get(flag, ("model.optim.sched.wsd_decay_style",))[0], None)
            result.notes.append(f"{flag} (Megatron reads it only with --lr-decay-style WSD)")
        return
    run_flag = "--train-samples" if "--train-samples" in given else "--train-iters"
    own = next(flag for flag, (_, run) in WSD_LENGTHS.items() if run == run_flag)
    other = next(flag for flag in WSD_LENGTHS if flag != own)
    if own not in given:
        ignored = f"; it ignores {other} with {run_flag}" if other in given else ""
        raise ConfigError(
            f"--lr-decay-style WSD with {run_flag} needs {own}, the length of the annealing to --min-lr at the "
            f"decay's end (Megatron asserts it{ignored}); give {own}"
        )
    if v[WSD_LENGTHS[own][0]] < 0:  # Megatron would hold --lr to the decay's end, then drop to --min-lr
        raise ConfigError(f"{own} {given[own][0]}: the annealing's length must be 0 or more; give its length")
    if other in given:
        v.pop(WSD_LENGTHS[other][0], None)
        result.notes.append(f"{other} (Megatron reads {own} with {run_flag})")


# Megatron's two spellings of each: the flags' schedule at a resume, and the checkpoint's.
OVERRIDE = ("--override-opt_param-scheduler", "--override-opt-param-scheduler")
USE_CHECKPOINT = ("--use-checkpoint-opt_param-scheduler", "--use-checkpoint-opt-param-scheduler")


def resumed_schedule(result: Translation) -> None:
    """Megatron asserts 'both override and use-checkpoint are set.': the pair is refused."""
    override = next((flag for flag in OVERRIDE if flag in result.given), None)
    use_checkpoint = next((flag for flag in USE_CHECKPOINT if flag in result.given), None)
    if override and use_checkpoint:
        raise ConfigError(
            f"{override} and {use_checkpoint}: the flags' schedule at a resume, or the checkpoint's; give one"
            " (Megatron asserts not both)"
        )


WEIGHT_DECAY_STYLE = "--weight-decay-incr-style"
WEIGHT_DECAY_STYLES = ("constant", "linear", "cosine")
WEIGHT_DECAY_BOUNDS = ("--start-weight-decay", "--end-weight-decay")


def weight_decay_increment(result: Translation) -> None:
    """Megatron's weight decay rising from --start-weight-decay to --end-weight-decay over the run
    (linear or cosine: model.optim.weight_decay_incr_style); with `constant`, its default, it asserts
    neither is given and takes --weight-decay. Equal bounds are a constant decay, taken as
    --weight-decay; either way Megatron ignores --weight-decay beside them, which is said."""
    given, v = result.given, result.values
    style = given.get(WEIGHT_DECAY_STYLE, ["constant"])[0]
    if style not in WEIGHT_DECAY_STYLES:
        raise ConfigError(
            f"{WEIGHT_DECAY_STYLE} {style}: not supported; use one of {', '.join(WEIGHT_DECAY_STYLES)}"
        )
    bounds = {
        flag: convert_value(flag, given[flag][0], float) for flag in WEIGHT_DECAY_BOUNDS if flag in given
    }
    if style == "constant":
        if bounds:
            raise ConfigError(
                f"{' and '.join(bounds)} with {WEIGHT_DECAY_STYLE} constant (Megatron's default): Megatron asserts"
                f" they are not given; give --weight-decay for a constant weight decay, or {WEIGHT_DECAY_STYLE}"
                " linear or cosine"
            )
        if WEIGHT_DECAY_STYLE in given:
            result.notes.append(
                f"{WEIGHT_DECAY_STYLE} constant (Megatron's default: the weight decay is --weight-decay)"
            )
        return
    _check_bounds(style, bounds, given)
    start, end = bounds.values()
    shown = " = ".join(f"{flag} {given[flag][0]}" for flag in WEIGHT_DECAY_BOUNDS)
    if "--weight-decay" in given:
        result.notes.append(f"--weight-decay (Megatron's decay is {shown.replace(' = ', ' to ')} instead)")
    if start == end:
        v["model.optim.weight_decay"] = start
        result.notes.append(f"{WEIGHT_DECAY_STYLE} {style} ({shown}: a constant weight decay of {start})")
        return
    v["model.optim.weight_decay_incr_style"] = style
    v["model.optim.start_weight_decay"] = start
    v["model.optim.end_weight_decay"] = end


def _check_bounds(style: str, bounds: dict[str, float], given: dict[str, list[str]]) -> None:
    """Megatron asserts both bounds beside linear or cosine, and 0 <= start <= end."""
    if len(bounds) < 2:
        raise ConfigError(
            f"{WEIGHT_DECAY_STYLE} {style} needs --start-weight-decay and --end-weight-decay (Megatron asserts"
            " both); give them"
        )
    for flag, value in bounds.items():
        if value < 0:
            raise ConfigError(f"{flag} {given[flag][0]}: must be 0 or more (Megatron asserts it)")
    start, end = bounds.values()
    if end < start:
        raise ConfigError(
            f"--end-weight-decay {given['--end-weight-decay'][0]} < --start-weight-decay"
            f" {given['--start-weight-decay'][0]}: Megatron's weight decay only rises; give an end at least the start"
        )


# The warmup flags in iterations and in samples, and the key each sets.
WARMUP_COUNTS = {
    "--lr-warmup-iters": "model.optim.sched.warmup_steps",
    "--lr-warmup-samples": "model.optim.sched.warmup_samples",
}


def _zero_warmups_dropped(v: dict[str, Any], given: dict[str, list[str]]) -> None:
    """Megatron asserts that the warmup flag of the other kind than the run's (and, beside
    --lr-warmup-fraction, of either kind) is 0, its default, not that it is absent: given as 0 it is
    taken as absent (`--train-samples ... --lr-warmup-iters 0` runs, as in Megatron)."""
    kind = "-samples" if "--train-samples" in given else "-iters"
    for flag, key in WARMUP_COUNTS.items():
        other = not flag.endswith(kind) or "--lr-warmup-fraction" in given
        if flag in given and other and convert_value(flag, given[flag][0], int) == 0:
            del given[flag]
            if key in MEGATRON_DEFAULTS:
                v[key] = MEGATRON_DEFAULTS[key]
            else:
                v.pop(key, None)


def iteration_flags(v: dict[str, Any], given: dict[str, list[str]]) -> None:
    """--train-iters or --train-samples (exclusive, as in Megatron); the checkpoint interval."""
    _zero_warmups_dropped(v, given)
    if "--train-samples" in given:
        if "--train-iters" in given:
            raise ConfigError("--train-iters and --train-samples: give only one (Megatron refuses both too)")
        samples = convert_value("--train-samples", given["--train-samples"][0], int)
        ramp = BatchRamp.from_config(v.get("model.rampup_batch_size"), v["model.global_batch_size"], 1)
        v["trainer.max_steps"] = ramp.iterations_for(samples)  # Megatron's count, ramp-up steps included
        schedule = _parsed_schedule(v, given)
        if schedule is not None:  # Megatron counts a schedule's last partial batch, not a ramp's
            v["trainer.max_steps"] = batch_schedule.iterations_for(schedule, samples)
        if v["trainer.max_steps"] < 1:  # the config's check would name --train-iters, which sets max_steps
            batch = v["model.global_batch_size"]
            raise ConfigError(
                f"--train-samples {samples}: less than one global batch of {batch} samples, so no iteration "
                f"trains (Megatron drops a partial last batch); give at least {batch}"
            )
        if samples < 1:  # a ramp's first batch trains even from 0, which the config's check would name
            raise ConfigError(f"--train-samples {samples}: must be at least 1; give the samples to train")
        v["trainer.train_samples"] = samples  # the train indices are built for it, as Megatron builds them
        if "--lr-decay-iters" in given or "--lr-warmup-iters" in given:
            raise ConfigError("--train-samples goes with --lr-decay-samples/--lr-warmup-samples, not *-iters")
        v.setdefault("model.optim.sched.decay_samples", samples)
    elif "--train-iters" not in given:
        raise ConfigError("pretrain_gpt.py needs --train-iters or --train-samples")
    elif "--lr-decay-samples" in given or "--lr-warmup-samples" in given:
        raise ConfigError("--train-iters goes with --lr-decay-iters/--lr-warmup-iters, not *-samples")
    elif "--rampup-batch-size" in given:
        _refuse_ramp_by_iterations(v, given)
    if "--lr-warmup-fraction" in given and ("--lr-warmup-iters" in given or "--lr-warmup-samples" in given):
        raise ConfigError("--lr-warmup-fraction and --lr-warmup-iters/--lr-warmup-samples: give only one")
    if "model.optim.sched.warmup_samples" in v or "model.optim.sched.warmup_fraction" in v:
        v["model.optim.sched.warmup_steps"] = 0
    if (
        not {"--save-interval", "--persistent-save-interval"} & given.keys()
    ):  # without --save, or with --save-xser: at the end
        v["exp_manager.checkpoint_callback_params.every_n_train_steps"] = v["trainer.max_steps"]


def schedule_lengths(v: dict[str, Any], given: dict[str, list[str]]) -> None:
    """Megatron's scheduler asserts a decay of at least one step, a warmup that ends before the decay
    does, and a warmup that starts at or below --lr. gptrain would read a decay of 0 as the whole run
    and train the others as given, so they are refused by their flags, as Megatron refuses them."""
    decay, decay_named = _decay_length(given)
    warmup_flag = next((flag for flag in WARMUP_FLAGS if flag in given), None)
    if warmup_flag is not None and decay > 0:
        text = given[warmup_flag][0]
        fraction = warmup_flag == "--lr-warmup-fraction"
        warmup = (
            convert_value(warmup_flag, text, float) * decay
            if fraction
            else convert_value(warmup_flag, text, int)
        )
        if warmup >= decay:
            raise ConfigError(
                f"{warmup_flag} {text} and the decay over {decay_named}: the warmup must end before the decay "
                "does, as Megatron asserts; give a shorter warmup or a longer decay"
            )
    init, lr = v.get("model.optim.sched.warmup_init_lr"), v["model.optim.lr"]
    if init is not None and init > lr:
        if "--lr" not in given:  # the rate it rises to is gptrain's default, on no command line
            raise ConfigError(
                f"--lr-warmup-init {init} is above the default --lr {lr}: the warmup rises from "
                f"--lr-warmup-init to --lr, as Megatron asserts; give --lr, at least {init}"
            )
        raise ConfigError(
            f"--lr-warmup-init {init} > --lr {lr}: the warmup rises from --lr-warmup-init to --lr, as Megatron "
            "asserts; give a smaller --lr-warmup-init"
        )


# The run's length flags, the decay flag of the same unit, and the unit's name.
DECAY_UNITS = {
    "--train-iters": ("--lr-decay-iters", "iteration"),
    "--train-samples": ("--lr-decay-samples", "sample"),
}


def _decay_length(given: dict[str, list[str]]) -> tuple[int, str]:
    """The decay's length in the run's unit and its flag as given (the run's length without one)."""
    run_flag = "--train-samples" if "--train-samples" in given else "--train-iters"
    decay_flag, unit = DECAY_UNITS[run_flag]
    flag = decay_flag if decay_flag in given else run_flag
    length = convert_value(flag, given[flag][0], int)
    if length <= 0 and flag == decay_flag:  # a run of no steps is the config's to refuse
        raise ConfigError(
            f"{flag} {length}: Megatron asserts a decay of at least one {unit}; give its length, or drop "
            f"{decay_flag} to decay over {run_flag}"
        )
    return length, f"{flag} {given[flag][0]}"


# The --lr-*-iters flags and their counterparts in samples.
SAMPLE_FLAGS = {"--lr-decay-iters": "--lr-decay-samples", "--lr-warmup-iters": "--lr-warmup-samples"}


def _refuse_ramp_by_iterations(v: dict[str, Any], given: dict[str, list[str]]) -> None:
    """Megatron ramps the batch only in a run counted in samples: beside --train-iters it asserts
    'expected no batch-size rampup for iteration-based training' (and since April 2026 ignores the
    flag). Refused, naming the sample counts of the same run: the --train-samples that trains those
    iterations, and each --lr-*-iters K as the samples the first K iterations of the ramp consume, so
    the warmup and decay end at the same iterations (K full batches would end them later), and WSD's
    annealing as the samples of its iterations before the decay's end."""
    batch, iterations = v["model.global_batch_size"], v["trainer.max_steps"]
    ramp = BatchRamp.from_config(v["model.rampup_batch_size"], batch, 1)
    instead = [f"--train-samples {ramp.train_samples_for(iterations)} in place of --train-iters {iterations}"]
    for flag, samples_flag in SAMPLE_FLAGS.items():
        count = convert_value(flag, given[flag][0], int) if flag in given else 0
        if count:
            instead.append(f"{samples_flag} {ramp.samples_for(count)} in place of {flag} {count}")
    annealing = (
        convert_value("--lr-wsd-decay-iters", given["--lr-wsd-decay-iters"][0], int)
        if "--lr-wsd-decay-iters" in given
        else 0
    )
    if (
        annealing > 0 and v["model.optim.sched.name"] == "WarmupStableDecay"
    ):  # counted back from the decay's end
        decay = v.get("model.optim.sched.max_steps") or iterations
        samples = ramp.samples_for(decay) - ramp.samples_for(max(0, decay - annealing))
        instead.append(f"--lr-wsd-decay-samples {samples} in place of --lr-wsd-decay-iters {annealing}")
    raise ConfigError(
        "--rampup-batch-size with --train-iters: Megatron ramps the batch only when the run is counted in "
        "samples (it asserts 'expected no batch-size rampup for iteration-based training'; since April 2026 "
        f"it ignores the flag); give {', '.join(instead)} for the ramp, or drop --rampup-batch-size for a "
        "constant batch"
    )
