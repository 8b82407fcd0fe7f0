"""Where a run starts from: its own newest checkpoint (a resume), or another run's
(exp_manager.resume_from_checkpoint), and the lines that say what was loaded."""

from __future__ import annotations

import dataclasses
import shlex
from collections.abc import Collection
from pathlib import Path

from gptrain.checkpoint.agreement import rank_0s
from gptrain.checkpoint.directory import find_checkpoint
from gptrain.checkpoint.fit import saved_sections
from gptrain.checkpoint.integrity import complete_steps
from gptrain.checkpoint.replace_recovery import recover_replaced_links
from gptrain.config import TrainingConfig
from gptrain.errors import ConfigError
from gptrain.parallel.rng import stream_layout
from gptrain.train.data_order import order_warnings
from gptrain.train.schedule import LRSchedule, decaying_groups
from gptrain.train.schedule_checks import resumed_schedule_change, shown_steps
from gptrain.train.session import Session
from gptrain.train.state import (
    PARTS,
    apply_checkpoint_state,
    checkpoint_state,
    parts_to_load,
    restore_rng_state,
)
from gptrain.train.weight_decay_schedule import described, weight_decay_change


def checkpoint_to_start_from(cfg: TrainingConfig) -> Path | None:
    """exp_manager.resume_from_checkpoint's checkpoint, while this run has none of its own to resume;
    as rank 0 finds both (a node's stale listing must not have its ranks load another checkpoint)."""
    em = cfg.exp_manager
    if not em.resume_from_checkpoint:
        return None
    own, source = Path(em.checkpoints_dir), em.resume_from_checkpoint

    def resumable() -> bool:  # rank 0's, after putting right what a kill in a save over a step link left
        if not em.resume_if_exists:
            return False
        recover_replaced_links(own)
        return bool(complete_steps(own))

    if rank_0s(resumable):  # one collective on every rank
        return None  # a requeued job continues its own run, not the one it started from
    return rank_0s(lambda: find_checkpoint(source))


def resume(s: Session, source: Path | None = None) -> None:
    """Load the newest complete checkpoint when exp_manager.resume_if_exists, or start from another
    run's checkpoint `source` (one log line either way)."""
    root = s.checkpoints.root
    if source is not None:
        start_from(s, source)
        return
    if not s.cfg.exp_manager.resume_if_exists:
        s.log(f"exp_manager.resume_if_exists=false: starting from scratch ({where_checkpoints_go(s)})")
        return
    if s.cfg.exp_manager.resume_from_checkpoint:  # see checkpoint_to_start_from: the run has its own
        s.log(unused_start_from_text(s.cfg.exp_manager.resume_from_checkpoint, root))
    sections: set[str] = set()  # of the checkpoint state_to_load was last asked for: the one loaded

    def state_to_load(saved: Collection[str]) -> dict:  # only the parts saved: see checkpoint_state
        sections.clear()
        sections.update(saved_sections(saved))
        parts = parts_to_load(PARTS, saved, s.scaler, s.log)
        return checkpoint_state(s.model, s.optimizer, s.schedule, s.scaler, s.state, parts, saved)

    loaded = s.checkpoints.load_newest_good(
        state_to_load,
        lambda st: apply_checkpoint_state(st, s.model, s.optimizer, s.schedule, s.scaler, s.state, s.log),
        lambda warning: report_damaged_checkpoint(s, warning),
    )
    if loaded is None:
        s.log(f"no complete checkpoint in {root}: starting from scratch")
        return
    path, extra = loaded
    log_load_notes(s)
    log_schedule_change(s)
    restore_rng_state(extra, stream_layout(s.cfg, s.world), s.log)
    warn_if_the_order_changed(s, extra)
    if "optim" not in sections:
        s.log(f"{path} holds model weights only (an import): optimizer, LR schedule and counters start fresh")
    s.log(f"resuming from {path} at iteration {s.state.step}, consumed samples {s.state.consumed_samples}")


def unused_start_from_text(source: str, root: Path) -> str:
    """Why exp_manager.resume_from_checkpoint is not loaded by a run with checkpoints of its own; for
    one of the run's own older checkpoints (Megatron's habit of going back after a loss spike), how."""
    text = (
        f"exp_manager.resume_from_checkpoint={source} not used: this run has checkpoints of its own in "
        f"{root} and resumes the newest (a requeued job continues itself); "
    )
    if Path(source).resolve().parent == root.resolve():
        command = shlex.join(["gptrain", "checkpoint", "rewind", str(root.parent), "--to", Path(source).name])
        return text + f"to go back to it, `{command}`"
    return text + "to start from that checkpoint, give the run a new directory"


def warn_if_the_order_changed(s: Session, extra: dict) -> None:
    """A warning for each split whose order is not the one the checkpoint's run had (a larger
    trainer.max_steps that shuffled it anew, as Megatron does): gptrain.train.data_order. Said by
    rank 0 (whose rank file every checkpoint has) and by the logging rank (the console's)."""
    if s.train_split is None or not (s.logging_rank or s.world.rank == 0):
        return
    saved = extra.get("train_order")
    consumed = s.state.consumed_samples
    for warning in order_warnings(saved, s.train_split, s.valid_split, consumed, s.cfg, s.train_built_for):
        s.log(warning)


def start_from(s: Session, source: Path) -> None:
    """Another run's checkpoint, in part as Megatron's --finetune/--no-load-optim/--no-load-rng say:
    finetune takes the weights only; without the optimizer, the schedule and loss scale start afresh too."""
    em = s.cfg.exp_manager
    parts = {"model"} if em.finetune else {"model", "train"}
    if em.load_optimizer and not em.finetune:
        parts |= {"optim", "schedule", "scaler"}
    loaded: set[str] = set()  # what the checkpoint gave of `parts` (an import has no optimizer)

    def state_to_load(saved: Collection[str]) -> dict:
        loaded.update(parts_to_load(parts, saved, s.scaler, s.log))
        return checkpoint_state(s.model, s.optimizer, s.schedule, s.scaler, s.state, loaded, saved)

    extra = s.checkpoints.load_verified(
        source,
        state_to_load,
        lambda st: apply_checkpoint_state(st, s.model, s.optimizer, s.schedule, s.scaler, s.state, s.log),
    )
    log_load_notes(s)
    if "schedule" in loaded:
        log_schedule_change(s)
    if em.load_rng and not em.finetune and restore_rng_state(extra, stream_layout(s.cfg, s.world), s.log):
        loaded.add("rng")
    restart_data = not em.load_data_position and "train" in loaded
    if restart_data:
        s.state.consumed_samples = 0  # the data from its first sample; the iteration goes on
    s.log(
        f"starting from {source} (exp_manager.resume_from_checkpoint; loaded {', '.join(sorted(loaded))}) "
        f"at iteration {s.state.step}, consumed samples {s.state.consumed_samples}"
        + (" (the data from its first sample: exp_manager.load_data_position=false)" if restart_data else "")
        + f"; {where_checkpoints_go(s)}"
    )


def where_checkpoints_go(s: Session) -> str:
    """The start line's word on saving: a run with checkpoints off (`gptrain megatron` without
    --save) must not name a directory it never writes."""
    if not s.cfg.exp_manager.create_checkpoint_callback:
        return "no checkpoints are saved: exp_manager.create_checkpoint_callback=false"
    return f"this run's checkpoints go to {s.checkpoints.root}"


def log_load_notes(s: Session) -> None:
    """What the load left out of the checkpoint (gptrain.checkpoint.reader's notes), once."""
    notes, s.checkpoints.notes = s.checkpoints.notes, []
    for note in dict.fromkeys(notes):  # the same tensor's rows for each checkpoint tried: said once
        s.log(f"warning: {note}")


def log_schedule_change(s: Session) -> None:
    """The schedule settings the config changed since the checkpoint, and the rate before and after:
    a jump of the learning rate at a resume is never silent (schedule_checks.resumed_schedule_change).
    With model.optim.sched.from_checkpoint, the checkpoint's settings are taken first (and said)."""
    if s.cfg.model.optim.sched.from_checkpoint:
        taken = take_checkpoints_schedule(s.schedule) + take_checkpoints_weight_decay(s.schedule)
        if taken:
            s.log(
                "learning-rate schedule from the checkpoint (model.optim.sched.from_checkpoint=true), not this"
                f" run's config: {', '.join(taken)}"
            )
        if s.schedule.resumed_weight_decay is None and (now := s.schedule.trained_weight_decay()) is not None:
            s.log(
                "model.optim.sched.from_checkpoint=true: the checkpoint records no weight decay (saved before"
                f" gptrain recorded it), so this run's config's applies: {described(now)}"
            )
    names = s.schedule_names(s.cfg, s.schedule.spec)
    line = resumed_schedule_change(s.cfg, s.schedule, s.state.step + 1, names)
    if line is not None:
        s.log(line)
    if (line := resumed_weight_decay_change(s.schedule, s.state.step + 1)) is not None:
        s.log(line)


def resumed_weight_decay_change(schedule: LRSchedule, iteration: int) -> str | None:
    """The weight decay's settings changed since the checkpoint (weight_decay_schedule.weight_decay_change);
    None for a checkpoint without the record."""
    now = schedule.trained_weight_decay()
    if schedule.resumed_weight_decay is None or now is None:
        return None
    old, old_step, old_batch = schedule.resumed_weight_decay
    return weight_decay_change(
        old, old_step, old_batch, now, schedule.step, schedule.spec.global_batch_size, iteration
    )


# What Megatron's --use-checkpoint-opt_param-scheduler takes from the checkpoint (its scheduler's state
# holds these, and the weight decay's): the key each is set by, and whether it is a length in steps.
FROM_CHECKPOINT = {
    "name": ("model.optim.sched.name", False),
    "lr": ("model.optim.lr", False),
    "min_lr": ("model.optim.sched.min_lr", False),
    "max_steps": ("model.optim.sched.max_steps", True),
    "warmup_steps": ("model.optim.sched.warmup_steps", True),
}


def take_checkpoints_schedule(schedule: LRSchedule) -> list[str]:
    """Put the loaded checkpoint's name, rates and lengths (FROM_CHECKPOINT) into `schedule`'s spec, the
    lengths in the steps its resumed step counts (a schedule in samples under another batch: the same
    samples); 'key checkpoint's (config config's)' for each that differed. Nothing without a record."""
    if schedule.resumed is None:
        return []
    recorded, spec = schedule.resumed[0], schedule.spec
    rescaled = spec.counts_samples and recorded.global_batch_size and spec.global_batch_size
    scale = recorded.global_batch_size / spec.global_batch_size if rescaled else 1
    taken = {
        field: getattr(recorded, field) * scale if length else getattr(recorded, field)
        for field, (_, length) in FROM_CHECKPOINT.items()
    }
    try:
        schedule.spec = dataclasses.replace(spec, **taken)
    except ConfigError as error:
        raise ConfigError(
            f"model.optim.sched.from_checkpoint: the checkpoint's schedule, {recorded.name}, with this run's other"
            f" settings: {error}"
        ) from None
    return [
        f"{key} {_shown(taken[field], length)} (config {_shown(getattr(spec, field), length)})"
        for field, (key, length) in FROM_CHECKPOINT.items()
        if taken[field] != getattr(spec, field)
    ]


def take_checkpoints_weight_decay(schedule: LRSchedule) -> list[str]:
    """Put the loaded checkpoint's weight decay (its style, start, end and length: Megatron's scheduler
    takes start_wd, end_wd, wd_incr_steps and wd_incr_style) into `schedule`, the length in the steps its
    resumed step counts; 'weight decay checkpoint's (config config's)' where it differed. Nothing
    without a record."""
    now = schedule.trained_weight_decay()
    if schedule.resumed_weight_decay is None or now is None:
        return []
    recorded, _, batch_then = schedule.resumed_weight_decay
    spec = schedule.spec
    rescaled = spec.counts_samples and batch_then and spec.global_batch_size
    taken = dataclasses.replace(
        recorded, steps=recorded.steps * batch_then / spec.global_batch_size if rescaled else recorded.steps
    )
    schedule.weight_decay, schedule.decayed = taken, decaying_groups(schedule.optimizer)
    return [] if taken == now else [f"weight decay {described(taken)} (config {described(now)})"]


def _shown(value: str | float, length: bool) -> str:
    """A name as it is, a length as steps are shown, a rate as the config writes it."""
    if isinstance(value, str):
        return value
    return shown_steps(value) if length else f"{value:g}"


def report_damaged_checkpoint(s: Session, warning: str) -> None:
    """A checkpoint passed over at resume: in the log and in TensorBoard, so it is not missed."""
    s.log(f"WARNING: {warning}")
    s.scalars.text("checkpoint/damaged", warning, s.state.step)
