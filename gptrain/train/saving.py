"""The run's checkpoint saves: when they are due, what they hold, their reports, and the
background write a failed run still finishes."""

from __future__ import annotations

import math
import os
import sys
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from gptrain.checkpoint.agreement import is_distributed
from gptrain.checkpoint.errors import root_cause
from gptrain.checkpoint.retention import STEP
from gptrain.checkpoint.save_report import SaveReport
from gptrain.config import TrainingConfig
from gptrain.errors import SIGNAL_SECONDS_ENV
from gptrain.parallel.rng import stream_layout
from gptrain.train.data_order import order_record
from gptrain.train.session import Session
from gptrain.train.state import checkpoint_state, rank_state
from gptrain.train.step import StepResult
from gptrain.train.watchdog import (
    DIAGNOSIS_WAIT_SECONDS,
    FIRST_STEP_FACTOR,
    GRACE_SECONDS,
    SYNC_MAX_SECONDS,
    collective_timeout_minutes,
)

# A save's floor on write speed, per rank, for its hang allowance (save_allowance_s): a slow shared
# file system under every rank of a job at once
SAVE_BYTES_PER_SECOND = 25e6


def saves_at(s: Session, step: int) -> bool:
    """A checkpoint is due after `step` (exp_manager.checkpoint_callback_params.every_n_train_steps)."""
    every = s.cfg.exp_manager.checkpoint_callback_params.every_n_train_steps
    return s.cfg.exp_manager.create_checkpoint_callback and bool(every) and step % every == 0


def save_checkpoint(s: Session, waited_for: bool = False) -> Path:
    """`waited_for`: the run waits for this save at once, with nothing to do beside its write
    (CheckpointManager.save)."""
    state = checkpoint_state(s.model, s.optimizer, s.schedule, s.scaler, s.state)
    extra = rank_state(stream_layout(s.cfg, s.world))
    if s.train_split is not None:  # the next samples, to tell a changed order at resume
        consumed = s.state.consumed_samples
        extra["train_order"] = order_record(
            s.train_split, s.valid_split, consumed, s.cfg.trainer, s.train_built_for, s.cfg.model
        )

    allowance = save_allowance(s, state)
    with (
        s.watchdog.saving(s.state.step, allowance),
        s.doing(f"while saving iteration {s.state.step}'s checkpoint"),
    ):
        path = s.checkpoints.save(s.state.step, state, extra, waited_for, metrics=validation_metrics(s))
    if s.checkpoints.writing:
        s.log(f"saving checkpoint {path.name} in the background")
    return path


def wait_for_saves(s: Session) -> None:
    """Wait for a background save and agree on its outcome (CheckpointManager.wait), watched as a save
    given the longest allowance: its write may still run, and its size is not at hand."""
    allowance = save_allowance_s(s.cfg.trainer.hang_timeout_minutes, sys.maxsize)
    with s.watchdog.saving(s.state.step, allowance):
        s.checkpoints.wait()


def save_allowance(s: Session, state: Any) -> float:
    """save_allowance_s of the largest rank's state (this rank's `state` among them): every rank waits in
    the save's collectives for the slowest writer, and one holding less ended a save another was still
    writing within its allowance. Found once, at the first save, by one all_reduce watched as a save of
    this rank's own bytes: a state's shapes never change, and no save after it adds a collective."""
    minutes = s.cfg.trainer.hang_timeout_minutes
    if s.save_bytes is None:
        own = state_bytes(state)
        with s.watchdog.saving(s.state.step, save_allowance_s(minutes, own)):
            s.save_bytes = largest_on_any_rank(own, s.device)
    return save_allowance_s(minutes, s.save_bytes)


def largest_on_any_rank(value: int, device: torch.device) -> int:
    """The largest of every rank's `value` (a collective every rank makes), `value` in one process."""
    if not is_distributed():
        return value
    largest = torch.tensor([value], dtype=torch.int64, device=device)
    dist.all_reduce(largest, op=dist.ReduceOp.MAX)
    return int(largest.item())


def save_allowance_s(hang_timeout_minutes: float, state_bytes: int) -> float:
    """How long a save of `state_bytes` (the largest rank's) may take before the hang watchdog ends the job:
    FIRST_STEP_FACTOR hang timeouts (50 min by default), or its bytes at SAVE_BYTES_PER_SECOND where
    longer (a 1.3B model's 16 GB: 11 min; 175B under TP8 x PP16, 22 GB a rank: 15 min), never past the
    process group's timeout less the diagnosis and grace: the other ranks wait in the save's collective
    for the slowest writer, where NCCL's abort (not requeued, nobody named) would end it anyway."""
    timeout_s = 60 * hang_timeout_minutes
    wanted = max(FIRST_STEP_FACTOR * timeout_s, state_bytes / SAVE_BYTES_PER_SECOND)
    group_s = 60 * collective_timeout_minutes(hang_timeout_minutes)
    return min(wanted, group_s - DIAGNOSIS_WAIT_SECONDS - GRACE_SECONDS - 2 * SYNC_MAX_SECONDS)


def state_bytes(state: Any) -> int:
    """The bytes of the tensors in a (nested) state dict held by this rank (a DTensor's local shard)."""
    if isinstance(state, dict):
        return sum(state_bytes(value) for value in state.values())
    if isinstance(state, list | tuple):
        return sum(state_bytes(value) for value in state)
    if isinstance(state, torch.Tensor):
        local = state.to_local() if hasattr(state, "to_local") else state
        return local.numel() * local.element_size()
    return 0


def validation_metrics(s: Session) -> dict[str, float] | None:
    """The validation loss for this save's COMPLETE, only when the validation ran at this same step:
    a save at a step without validation records none (retention ranks it below those that do, instead
    of by an older step's loss); a save on a stop gets its loss from the resumed run
    (record_left_due_validation)."""
    if s.validation is None or s.validation[0] != s.state.step:
        return None
    return {"val_loss": s.validation[1]}


def record_left_due_validation(s: Session) -> None:
    """The loss of the validation a stop left due (eval_splits.validate_if_left_due) into the COMPLETE
    of the checkpoint the stop saved and this run resumed from (rank 0 alone, no collective): no save
    at that step follows it to record it. A marker that cannot be rewritten costs only the ranking."""
    metrics = validation_metrics(s)
    if metrics is None:
        return
    try:
        recorded = s.checkpoints.record_metrics_of_resumed(s.state.step, metrics)
    except OSError as error:
        s.log(
            f"warning: the validation loss of iteration {s.state.step} could not be recorded in its "
            f"checkpoint ({root_cause(error)}): retention ranks it below every checkpoint with a loss"
        )
        return
    if recorded is not None:
        s.log(
            f"recorded val_loss {metrics['val_loss']:.4g} of iteration {s.state.step} in {recorded.name}'s COMPLETE"
        )


def retention_warning(cfg: TrainingConfig) -> str | None:
    """Retention by val_loss ranks only the saves made at a validated step (validation_metrics): say so
    at the start when few or none of them are (NeMo saves at each validation; gptrain on its interval).
    By step every save ranks."""
    em, t = cfg.exp_manager, cfg.trainer
    params = em.checkpoint_callback_params
    if not em.create_checkpoint_callback or params.monitor in (None, STEP) or params.save_top_k < 1:
        return None
    key = "exp_manager.checkpoint_callback_params"
    if not t.val_check_interval or t.limit_val_batches < 1:
        return (
            f"{key}.monitor={params.monitor}, but no validation runs (trainer.val_check_interval="
            f"{t.val_check_interval}, trainer.limit_val_batches={t.limit_val_batches}): no save records it,"
            f" so the newest {params.save_top_k} are kept"
        )
    every = params.every_n_train_steps
    if every and every % t.val_check_interval:
        return (
            f"{key}.every_n_train_steps={every} is not a multiple of trainer.val_check_interval="
            f"{t.val_check_interval}: the saves between validations record no {params.monitor} and rank below"
            f" every save that does (monitor={params.monitor}); make it a multiple to rank them all"
        )
    return None


def watch_checkpoint_saves(s: Session) -> None:
    """Report each save's stall when it is written (and, once, a save longer than Slurm's warning
    lead); a background save's staging copy must be finished before the optimizer changes the
    weights it copies."""
    lead, warned = signal_lead_seconds(), []

    def on_saved(report: SaveReport) -> None:
        report_save(s, report)
        if lead is not None and report.write_s > lead and not warned:
            warned.append(report.step)
            s.log(f"warning: {save_outlasts_signal(report, lead)}")

    s.checkpoints.on_saved = on_saved
    s.checkpoints.note = s.watchdog.busy
    s.optimizer.register_step_pre_hook(lambda *_: s.checkpoints.wait_for_staging())


def signal_lead_seconds() -> int | None:
    """The seconds Slurm's warning signal comes before the time limit, as the batch script of a
    requeueable training exports them (SIGNAL_SECONDS_ENV); None outside one."""
    value = os.environ.get(SIGNAL_SECONDS_ENV, "")
    return int(value) if value.isdigit() and int(value) > 0 else None


def save_outlasts_signal(report: SaveReport, lead: int) -> str:
    """A stop at the time limit saves once more before its exit: a save longer than the signal's lead
    is killed unfinished, the job ends TIMEOUT (not requeued) and the steps since the last checkpoint
    are lost."""
    return (
        f"saving {report.path.name} took {report.write_s:.0f} s, longer than the {lead} s by which Slurm's "
        f"warning signal comes before the time limit (cluster.signal_seconds): a stop there would be killed "
        f"before its checkpoint is complete and the job not requeued; give cluster.signal_seconds="
        f"{2 * math.ceil(report.write_s)} or more (twice this save)"
    )


def prepare_checkpoint_staging(s: Session, result: StepResult) -> bool:
    """Have the pinned staging buffer of async saves allocated in the background while training
    goes on, so the first save does not stall for it. Waits for a step that updated (the
    optimizer state exists then, and building its state dict changes nothing); True when done
    or not needed."""
    if not s.checkpoints.async_save or s.device.type != "cuda":
        return True
    if not result.updated:
        return False
    s.checkpoints.prepare_staging(checkpoint_state(s.model, s.optimizer, s.schedule, s.scaler, s.state))
    return True


def report_save(s: Session, report: SaveReport) -> None:
    """The size only on the logging rank: finding it elsewhere is work for a number no one reads."""
    s.log(report.describe(size=s.logging_rank))
    if not s.logging_rank:
        return
    s.scalars.add(
        {
            "checkpoint/stall_ms": 1000 * report.stall_s,
            "checkpoint/write_s": report.write_s,
            "checkpoint/size_GB": report.bytes / 1e9,
        },
        report.step,
    )


def finish_saves_after_failure(s: Session) -> None:
    """A background save of a finished step still counts when the run fails after it: give
    it the hang timeout (at least a minute) to finish writing, then leave."""
    timeout_s = max(60.0, 60.0 * s.cfg.trainer.hang_timeout_minutes)
    note = s.checkpoints.finish_after_failure(timeout_s)
    if note is not None:
        s.log(note)
