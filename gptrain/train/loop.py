"""The training loop: `train(cfg)` reads top to bottom, every piece is a named function.

Seams for parallel layouts (gptrain/parallel plugs in here without touching the model):
  builders.build_model              build on meta, to_empty(device), init_weights(generator)
  builders.build_parallel_model     meta model -> gptrain.parallel: PP split, TP, AC, compile, FSDP2/DDP
  builders.data_parallel_rank_size  (dp_rank, dp_size) that the sampler slices batches by
  builders.dropout_seed             this rank's seed of the global streams dropout draws from
  builders.build_step_options       loss all-reduce (`reduce_sum`) and grad-norm function
  builders.with_parallel_seams      the layout's reduce/norm and, for TP/PP, forward_backward/eval_fn
  Session.step_fn                   one optimizer step (step.train_step); TP and pipeline layouts
                                    plug in through StepOptions.forward_backward/eval_fn instead.
                                    With trainer.run_ahead where updates are decided on the device,
                                    overlap.StepRunner runs the step's parts itself, one step ahead
  builders.is_logging_rank          the rank that prints iteration lines (last pipeline stage)
  stop_agreement.StopAgreement      every rank stops (and checkpoints) at the same step
With world size 1 no process group is created.
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Callable, Collection, Iterator, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import torch
from torch import nn

from gptrain.checkpoint.directory import find_checkpoint
from gptrain.checkpoint.integrity import complete_steps
from gptrain.checkpoint.manager import CheckpointManager, SaveReport
from gptrain.checkpoint.reader import rank_0s, saved_sections
from gptrain.config import TrainingConfig
from gptrain.errors import EXIT_REQUEUE, DataError, GptrainError, error_text, find_out_of_memory
from gptrain.parallel.layout import STARTED, check_layout
from gptrain.parallel.mesh import World, init_distributed, shutdown, world_from_env
from gptrain.parallel.parallelize import check_parallel_choices
from gptrain.parallel.rng import stream_layout, stream_warnings
from gptrain.train import builders as b
from gptrain.train.batches import (
    GPTBatchDataset,
    build_loader,
    loader_worker_died,
    raise_if_a_worker_died,
    shut_down_workers,
)
from gptrain.train.data_order import order_record, order_warnings
from gptrain.train.evaluation import EvalSetup, evaluate_loss
from gptrain.train.logline import format_validation_lines
from gptrain.train.loss_scale import LossScaler
from gptrain.train.memory_check import out_of_memory, start_warning
from gptrain.train.meter import IntervalMeter, RunShape, interval_report
from gptrain.train.metrics import evaluation_scalars
from gptrain.train.overlap import StepRunner, can_run_ahead
from gptrain.train.rampup import BatchRamp
from gptrain.train.results import (
    TB_TEST_LOSS,
    TB_VAL_LOSS,
    RunLog,
    Scalars,
    forget_test_done,
    record_test_done,
    tested_at,
    write_run_files,
)
from gptrain.train.run_lock import claim_run_directory, requeued_own_checkpoint
from gptrain.train.schedule import LRSchedule, ScheduleSpec
from gptrain.train.schedule_checks import (
    ScheduleNames,
    names_in_config,
    resumed_schedule_change,
    run_schedule_warnings,
)
from gptrain.train.signals import StopRequest
from gptrain.train.state import (
    PARTS,
    TrainState,
    apply_checkpoint_state,
    checkpoint_state,
    parts_to_load,
    rank_state,
    restore_rng_state,
)
from gptrain.train.step import Batch, StepOptions, StepResult, train_step
from gptrain.train.step_times import StepTimes
from gptrain.train.stop_agreement import StopAgreement
from gptrain.train.wandb_logger import WandbRun, require_wandb
from gptrain.train.watchdog import Watchdog, collective_timeout_minutes


class TrainingDivergedError(GptrainError):
    """The loss stayed non-finite for trainer.max_consecutive_nonfinite iterations."""


# Names the schedule's settings as the user gave them, at the start and at a resume (ScheduleNames).
ScheduleNaming = Callable[[TrainingConfig, ScheduleSpec], ScheduleNames]


@dataclass
class Session:
    """The live pieces of one run (built by `train`, used by the loop functions)."""

    cfg: TrainingConfig
    world: World
    device: torch.device
    model: nn.Module
    optimizer: torch.optim.Optimizer
    schedule: LRSchedule
    scaler: LossScaler
    step_opts: StepOptions
    checkpoints: CheckpointManager
    log: RunLog
    scalars: Scalars
    dp_rank: int = 0
    dp_size: int = 1
    logging_rank: bool = True
    flops_per_iteration: float = 0.0
    peak_tflops: float | None = None
    state: TrainState = field(default_factory=TrainState)
    step_fn: Callable[[list[Batch]], StepResult] | None = None
    watchdog: Watchdog = field(default_factory=lambda: Watchdog(0, 1, 0.0))  # disabled unless given
    train_split: Sequence[Any] | None = None
    """The train split's samples, in order (gptrain.train.data_order: its next samples are saved)."""
    valid_split: Sequence[Any] | None = None
    """The validation split's samples, in order (its first ones are saved, as train_split's next)."""
    schedule_names: ScheduleNaming = names_in_config
    """`gptrain megatron` names its flags: in the start warnings and the line at a resume."""

    def __post_init__(self) -> None:
        if self.step_fn is None:
            self.step_fn = lambda mbs: train_step(
                self.model, self.optimizer, mbs, self.scaler, self.device, self.step_opts
            )

    @property
    def num_microbatches(self) -> int:
        """Micro-batches per step at the full global batch (evaluation always uses it)."""
        m = self.cfg.model
        return m.global_batch_size // (m.micro_batch_size * self.dp_size)

    def current_global_batch(self) -> int:
        """Global batch of the coming step (smaller during a batch-size ramp-up)."""
        m = self.cfg.model
        ramp = BatchRamp.from_config(
            m.rampup_batch_size, m.global_batch_size, m.micro_batch_size * self.dp_size
        )
        return ramp.at(self.state.consumed_samples)


def train(cfg: TrainingConfig, schedule_names: ScheduleNaming = names_in_config) -> int:
    """Train as configured; 0 at max_steps, EXIT_REQUEUE after a signal or max_time checkpoint.
    `schedule_names`: `gptrain megatron` names its flags in the start warnings, not the config's keys."""
    require_wandb(cfg)  # on every rank, before any of them starts
    world = world_from_env()
    # A layout the started processes cannot hold is one line before any rendezvous: with a peer
    # that never joins, the process group would wait for it instead.
    check_layout(cfg.model, world.world_size, cfg.trainer.devices, STARTED)
    check_parallel_choices(cfg)
    if world.world_size > 1:
        # collectives outlive the hang watchdog, so that it, not an opaque timeout, names a stuck rank
        timeout = collective_timeout_minutes(cfg.trainer.hang_timeout_minutes)
        init_distributed(world, cfg.trainer.resolved_accelerator(), timeout)
    log_dir = Path(cfg.exp_manager.explicit_log_dir)
    em = cfg.exp_manager  # one run per directory, claimed before anything is written into it
    # as rank 0 sees it: a rank whose stale listing lacks the checkpoint would not resume
    own = None if em.resume_if_exists else rank_0s(lambda: requeued_own_checkpoint(log_dir))
    if own is not None:  # the job that wrote it, requeued: the same run, which resumes
        em.resume_if_exists = True
    run_lock = claim_run_directory(
        log_dir,
        world.rank,
        world.world_size,
        em.resume_if_exists,
        em.move_aside_earlier_run,
        saves=em.create_checkpoint_callback,
    )
    if own is not None:
        run_lock.notes.append(
            f"exp_manager.resume_if_exists=false, but this is Slurm job {os.environ['SLURM_JOB_ID']} "
            f"requeued and {own} is its own checkpoint: resuming it"
        )
    logging_rank = b.is_logging_rank(cfg, world)
    log = RunLog(log_dir, world.rank, world.local_rank, echo=logging_rank)
    run_lock.log_notes(log)
    scalars = Scalars(Path(em.events_dir), enabled=logging_rank and em.create_tensorboard_logger)
    stop = StopRequest(cfg.trainer.max_time_seconds()).install()
    watchdog = Watchdog.start(cfg.trainer.hang_timeout_minutes, world.rank, world.world_size)
    watchdog.note = log.to_file  # the hang line in the run's own log, beside stderr
    watchdog.requeue = cfg.exp_manager.create_checkpoint_callback
    session: Session | None = None
    failed, requeue = True, False
    vocab, device_bytes = None, None
    try:
        source = checkpoint_to_start_from(cfg)  # a wrong path fails now, not after the model is built
        if logging_rank and cfg.exp_manager.create_wandb_logger:
            scalars.send_to_wandb(WandbRun.start(cfg))
        device = b.select_device(cfg, world)
        b.seed_everything(b.dropout_seed(cfg, world))
        tokenizer = b.build_tokenizer(cfg)
        vocab, padded_vocab = b.padded_vocab_size(cfg, tokenizer)
        device_bytes = b.device_memory_bytes(device)
        if (
            device_bytes
            and logging_rank
            and (warning := start_warning(cfg, vocab, device_bytes, world.world_size))
        ):
            log(warning)
        model_config = b.build_model_config(cfg, padded_vocab)
        model = b.build_parallel_model(model_config, cfg, world, device)
        optimizer = b.build_adamw(cfg, model, device)
        dp_rank, dp_size = b.data_parallel_rank_size(cfg, world)
        b.check_batch_sizes(cfg, dp_size)
        session = Session(
            cfg=cfg,
            world=world,
            device=device,
            model=model,
            optimizer=optimizer,
            schedule=LRSchedule(optimizer, b.schedule_spec(cfg)),
            scaler=b.build_scaler(cfg),
            step_opts=b.with_parallel_seams(b.build_step_options(cfg, dp_size), model),
            checkpoints=b.build_checkpoint_manager(cfg, world, vocab, device, tokenizer, model_config),
            log=log,
            scalars=scalars,
            dp_rank=dp_rank,
            dp_size=dp_size,
            logging_rank=logging_rank,
            watchdog=watchdog,
            schedule_names=schedule_names,
        )
        set_throughput_reference(session, model_config)
        watch_checkpoint_saves(session)
        train_data, valid_data, test_data = b.build_datasets(cfg, vocab, tokenizer, world.local_rank)
        session.train_split = getattr(train_data, "samples", None)
        session.valid_split = getattr(valid_data, "samples", None)
        log_start(session, model_config, log_dir, schedule_names)
        resume(session, source)
        if world.rank == 0:  # after the resume: a config its checkpoint refused must not replace the run's
            write_run_files(log_dir, cfg.to_yaml())
        for line in b.megatron_start_lines(cfg, vocab, model_config, dp_size):
            session.log(line)
        code = run(session, train_data, valid_data, test_data, stop)
        requeue = code == EXIT_REQUEUE
        session.checkpoints.close()  # old checkpoints are removed in the background: let that finish
        b.log_memory(session.log, device, session.state.step)
        failed = False
        return code
    except Exception as error:  # out of memory: one line with the plan's figures, not CUDA's traceback
        final = error
        if (died := loader_worker_died(error)) is not None:
            final = died
        elif isinstance(oom := find_out_of_memory(error), torch.OutOfMemoryError) and not isinstance(
            error, GptrainError
        ):  # also wrapped, as pipeline schedules re-raise a stage's error
            final = out_of_memory(cfg, vocab, world.rank, device_bytes, oom, world.world_size)
        elif (lost := lost_a_peer(error, world, watchdog, session)) is not None:
            final = lost
        if isinstance(final, GptrainError):  # the run's log says why it ended, as the console does
            log.to_file(f"gptrain: error: {error_text(final)}")
        if final is error:
            raise
        raise final from None
    finally:
        watchdog.close()
        if failed and session is not None:
            finish_saves_after_failure(session)
        run_lock.release()
        # a run stopped for a requeue exits 75, not of a SIGTERM during its shutdown (srun's when
        # another rank has exited, Slurm's at the time limit after its warning signal)
        stop.uninstall(keep_ignoring=requeue)
        scalars.close()
        log.close()
        if world.world_size > 1:
            shutdown(wait_for_peers=not failed)  # peers may be stuck in a collective: do not wait


# How torch's gloo and NCCL backends say a peer's connection ended under a collective.
PEER_GONE = ("Connection reset by peer", "Connection closed by peer", "remote process exited")


def lost_a_peer(error: Exception, world: World, watchdog: Watchdog, s: Session | None) -> GptrainError | None:
    """A collective that failed because another rank ended (SIGKILL from the out-of-memory killer, a
    crash): one line naming the rank where it can be found, instead of the backend's traceback
    naming a socket address."""
    if world.world_size < 2 or not any(marker in str(error) for marker in PEER_GONE):
        return None
    where = f" at iteration {s.state.step + 1}" if s is not None else " during start-up"
    gone = watchdog.gone_peers() or "another rank (its own output, or the launcher's, says which and why)"
    newest = s.checkpoints.newest() if s is not None else None
    return GptrainError(
        f"rank {world.rank}: a collective lost its peer{where}: {gone} ended; the same command resumes "
        f"from the last complete checkpoint ({newest or 'none yet: it starts over'})"
    )


def set_throughput_reference(s: Session, model_config: object) -> None:
    """FLOPs of one global batch (Megatron's formula) and the device's peak for MFU."""
    from gptrain.models.flops import device_peak_tflops, megatron_flops_per_iteration

    s.flops_per_iteration = float(megatron_flops_per_iteration(model_config, s.cfg.model.global_batch_size))
    if s.device.type == "cuda":
        s.peak_tflops = device_peak_tflops(torch.cuda.get_device_name(s.device), s.cfg.trainer.precision)


def log_start(
    s: Session, model_config: object, log_dir: Path, schedule_names: ScheduleNaming = names_in_config
) -> None:
    """The banner. Parameters of the whole model from its config: this rank's modules hold one
    pipeline stage only (the logging rank's is the last)."""
    from gptrain.models.flops import count_parameters

    params = count_parameters(model_config)
    s.log(
        f"gptrain: {params:,} parameters | {s.flops_per_iteration:.3e} FLOPs per iteration | "
        f"{s.num_microbatches} microbatches per step | results in {log_dir}"
    )
    names = schedule_names(s.cfg, s.schedule.spec)
    for warning in run_schedule_warnings(s.cfg, s.schedule.spec, names) + stream_warnings(s.cfg.model):
        s.log(f"warning: {warning}")
    # fp32 weights and AdamW's two moments: 12 bytes a parameter, whatever the layout. Said by the
    # logging rank (the console's: rank 0's own lines go to its file only) and by rank 0.
    saving = s.cfg.exp_manager.create_checkpoint_callback
    says = s.world.rank == 0 or s.logging_rank
    space = s.checkpoints.space_warning(12 * params) if says and saving else None
    if space is not None:
        s.log(f"warning: {space}")


def checkpoint_to_start_from(cfg: TrainingConfig) -> Path | None:
    """exp_manager.resume_from_checkpoint's checkpoint, while this run has none of its own to resume;
    as rank 0 finds both (a node's stale listing must not have its ranks load another checkpoint)."""
    em = cfg.exp_manager
    if not em.resume_from_checkpoint:
        return None
    own, source = Path(cfg.results_path("checkpoints")), em.resume_from_checkpoint
    if rank_0s(lambda: bool(em.resume_if_exists and complete_steps(own))):  # one collective on every rank
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
    for warning in order_warnings(
        saved, s.train_split, s.valid_split, s.state.consumed_samples, s.cfg.trainer
    ):
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
    a jump of the learning rate at a resume is never silent (schedule_checks.resumed_schedule_change)."""
    names = s.schedule_names(s.cfg, s.schedule.spec)
    line = resumed_schedule_change(s.cfg, s.schedule, s.state.step + 1, names)
    if line is not None:
        s.log(line)


def report_damaged_checkpoint(s: Session, warning: str) -> None:
    """A checkpoint passed over at resume: in the log and in TensorBoard, so it is not missed."""
    s.log(f"WARNING: {warning}")
    s.scalars.text("checkpoint/damaged", warning, s.state.step)


def watch_checkpoint_saves(s: Session) -> None:
    """Report each save's stall when it is written; a background save's staging copy must be
    finished before the optimizer changes the weights it copies."""
    s.checkpoints.on_saved = lambda report: report_save(s, report)
    s.optimizer.register_step_pre_hook(lambda *_: s.checkpoints.wait_for_staging())


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


def save_checkpoint(s: Session, waited_for: bool = False) -> Path:
    """`waited_for`: the run waits for this save at once, with nothing to do beside its write
    (CheckpointManager.save)."""
    state = checkpoint_state(s.model, s.optimizer, s.schedule, s.scaler, s.state)
    extra = rank_state(stream_layout(s.cfg, s.world))
    if s.train_split is not None:  # the next samples, to tell a changed order at resume
        consumed = s.state.consumed_samples
        extra["train_order"] = order_record(s.train_split, s.valid_split, consumed, s.cfg.trainer)

    path = s.checkpoints.save(s.state.step, state, extra, waited_for)
    if s.checkpoints.writing:
        s.log(f"saving checkpoint {path.name} in the background")
    return path


def microbatches(s: Session, data: GPTBatchDataset) -> Iterator[list[Batch]]:
    """The micro-batches of each global batch for this rank, from consumed_samples on. Counts its
    own iterations and samples: under trainer.run_ahead a batch is drawn before the step before it
    is recorded."""
    m = s.cfg.model
    loader = build_loader(
        data,
        s.state.consumed_samples,
        m.micro_batch_size,
        s.dp_rank,
        s.dp_size,
        num_workers=m.data.num_workers,
        seed=m.seed,
        pin_memory=s.device.type == "cuda",
    )
    it = iter(loader)
    per_micro_step = m.micro_batch_size * s.dp_size
    iteration, consumed = s.state.step, s.state.consumed_samples
    while True:
        iteration += 1
        count = s.current_global_batch() // per_micro_step
        try:
            batch = [mb for _, mb in zip(range(count), it, strict=False)]
        except (RuntimeError, ConnectionError, EOFError) as error:  # asked while `it` knows its workers
            raise_if_a_worker_died(error, it)
            raise
        except KeyboardInterrupt:
            # A SIGINT to this process alone (`kill -INT <pid>`) during a receive left a worker handing over
            # a batch's shared memory on a connection this process closed as it exited: the worker printed
            # a traceback, cut off by its shutdown, after "gptrain: interrupted". Its workers end now,
            # while the interrupted receive still holds that connection open.
            shut_down_workers(it)
            raise
        if len(batch) < count:
            raise DataError(ran_out_of_samples(s.cfg, iteration, consumed))
        consumed += count * per_micro_step
        yield batch


def ran_out_of_samples(cfg: TrainingConfig, iteration: int, consumed: int) -> str:
    """What to do when the train split ends before trainer.max_steps. The split is sized, as Megatron
    sizes it, for max_steps x global batch: a run resumed with a smaller global batch than it began
    with has consumed more by now than that allots, and needs trainer.train_samples, not more data."""
    gbs, max_steps = cfg.model.global_batch_size, cfg.trainer.max_steps
    text = f"the train split ran out of samples at iteration {iteration} (after {consumed} consumed samples)"
    if consumed <= (iteration - 1) * gbs:
        return f"{text}: add data or lower trainer.max_steps"
    needed = consumed + (max_steps - iteration + 1) * gbs
    return (
        f"{text}: earlier iterations ran a larger global batch than model.global_batch_size={gbs} (a resume "
        f"with a smaller one), while the split is sized for trainer.max_steps x global batch, as Megatron "
        f"sizes it; set trainer.train_samples={needed} (those consumed plus {max_steps - iteration + 1} "
        f"iterations of {gbs}) to build it for what the run reads"
    )


def run(
    s: Session,
    train_data: GPTBatchDataset,
    valid_data: GPTBatchDataset | None,
    test_data: GPTBatchDataset | None,
    stop: StopRequest,
) -> int:
    """Iterate to trainer.max_steps; at each step boundary log, check, validate, checkpoint.

    At the end: validation, the final checkpoint, the test split (beside a background write of
    that checkpoint, which the run then waits for). Resumed at max_steps: finish_at_max_steps.
    """
    t = s.cfg.trainer
    if s.state.step >= t.max_steps:
        return finish_at_max_steps(s, test_data)
    agreement = StopAgreement()
    meter = IntervalMeter(start_step=s.state.step)
    times = StepTimes.open(Path(s.cfg.exp_manager.explicit_log_dir), s.world.rank, s.world.world_size)
    early = agree_before_training(s, agreement, stop)
    if early is not None:  # asked during start-up: not worth a validation the requeued run repeats
        return stop_before_training(s, early)
    # out of the first interval's time, as every validation is out of its own; agreed again after
    # it, so that a stop asked during it (the resumed run's longest work) ends the run before a step
    with meter.excluded(), times.excluded():
        validated = validate_if_left_due(s, valid_data)
    early = agree_before_training(s, agreement, stop) if validated else None
    if early is not None:
        return stop_before_training(s, early)
    if s.world.rank == 0:
        forget_test_done(Path(s.cfg.exp_manager.explicit_log_dir))
    batches = microbatches(s, train_data)
    runner = StepRunner(s, batches, can_run_ahead(s))
    saved_at = -1
    tested = has_batches(test_data, t.limit_test_batches)  # after the last save, beside its write
    staging_prepared = False
    stopping: str | None = None  # agreed while the next step was queued ahead: it finishes first
    while s.state.step < t.max_steps:
        step = s.state.step + 1
        # the first step, every log_every_n_steps, and the last: `status` and the curves end where the run did
        logged = step == meter.start_step + 1 or step % t.log_every_n_steps == 0 or step >= t.max_steps
        with s.watchdog.step(step):
            result, samples = runner.next(stopping is None and quiet_boundary(s, step, logged))
        record(s, result, samples)
        if not staging_prepared:
            staging_prepared = prepare_checkpoint_staging(s, result)
        s.checkpoints.poll()
        # Megatron prints the rate after the scheduler step: the one the next iteration uses
        meter.add(result, s.schedule.current_lr(), s.scaler.scale, samples)
        with s.watchdog.boundary(step):  # a log write on a hung mount holds every rank in the exchange
            if logged:
                log_interval(s, meter)
            check_finite(s, result)
            reason = times.timed_sync(
                s.state.step, logged, partial(agreement.exchange, stop.reason(), logged)
            )
        stopping = stopping or reason
        # at max_steps: finish normally; with a step queued ahead: stop after it
        if stopping is not None and s.state.step < t.max_steps and not runner.ahead:
            if meter.iterations:  # the steps since the last line: their losses are not lost with the stop
                log_interval(s, meter)
            return stop_for_requeue(s, stopping)
        last = s.state.step >= t.max_steps
        validated = validates_at(s, s.state.step) or last
        if validated:  # before the save: the checkpoint records it done
            with meter.excluded(), times.excluded():
                validate(s, valid_data)
        if saves_at(s, s.state.step) and s.state.consecutive_nonfinite == 0:
            # not during a non-finite streak: the last good one stays newest
            with meter.excluded(), times.excluded():
                save_checkpoint(s, waited_for=last and not tested)
            saved_at = s.state.step
        took_time = saved_at == s.state.step or (validated and has_batches(valid_data, t.limit_val_batches))
        if took_time and not last and (late := asked_during(s, agreement, stop)) is not None:
            if meter.iterations:
                log_interval(s, meter)
            return stop_for_requeue(s, late, saved=saved_at == s.state.step)
    em = s.cfg.exp_manager
    if saved_at != s.state.step and em.create_checkpoint_callback and em.checkpoint_callback_params.save_last:
        save_checkpoint(s, waited_for=not tested)
    evaluate_test_split(s, test_data)
    return 0


def finish_at_max_steps(s: Session, test_data: GPTBatchDataset | None) -> int:
    """A run resumed at trainer.max_steps trains nothing, but evaluates the test split when the run
    that saved its checkpoint stopped before that (preempted, killed or failed right after its last
    save): the record of the test split done (results.record_test_done) does not name this iteration.
    As rank 0 reads it: every rank must evaluate, or none."""
    step, t = s.state.step, s.cfg.trainer
    recorded = rank_0s(lambda: tested_at(Path(s.cfg.exp_manager.explicit_log_dir)))
    if recorded == step or not has_batches(test_data, t.limit_test_batches):
        s.log(f"iteration {step} is already at trainer.max_steps={t.max_steps}: nothing to do")
        return 0
    s.log(
        f"iteration {step} is already at trainer.max_steps={t.max_steps}: evaluating the test split,"
        " which the run stopped before"
    )
    evaluate_test_split(s, test_data)
    return 0


def evaluate_test_split(s: Session, data: GPTBatchDataset | None) -> None:
    """The test split at the end of the run (beside a background write of its last save, which is
    waited for), then recorded done, so a resume at max_steps does not evaluate it again."""
    evaluate_split(s, data, s.cfg.trainer.limit_test_batches, " on test set", TB_TEST_LOSS)
    s.checkpoints.wait()
    if s.world.rank == 0 and has_batches(data, s.cfg.trainer.limit_test_batches):
        record_test_done(Path(s.cfg.exp_manager.explicit_log_dir), s.state.step)


def asked_during(s: Session, agreement: StopAgreement, stop: StopRequest) -> str | None:
    """A stop asked for while this step's save or validation ran, agreed by every rank now (they all
    saved or validated at this step). Slurm's warning signal most likely lands in the longest work
    of a step: left to the next step's end, it cost one more step and a second save in the time
    before the kill. No step is ever queued ahead of a save or validation (trainer.run_ahead), so
    the run can stop right here."""
    with s.watchdog.boundary(s.state.step):
        return agreement.exchange(stop.reason(), read_now=True)


def stop_before_training(s: Session, reason: str) -> int:
    """A stop signalled during start-up, agreed by every rank before the first step: nothing was
    trained since the checkpoint the run loaded (or since its start), so nothing is saved (a copy of
    that checkpoint would only cost the time left before the kill). The requeued job starts up the
    same way again; with checkpoints off a requeue is not asked for, as in stop_for_requeue."""
    if not s.cfg.exp_manager.create_checkpoint_callback:
        s.log(
            f"stopping before the first step: {reason}; nothing trained, exit 0 (not requeued: checkpoints are off)"
        )
        return 0
    start = f"iteration {s.state.step}'s checkpoint" if s.state.step else "no checkpoint"
    s.log(
        f"stopping before the first step: {reason}; nothing trained since {start}, nothing saved;"
        f" exit {EXIT_REQUEUE} to be requeued"
    )
    return EXIT_REQUEUE


def stop_for_requeue(s: Session, reason: str, saved: bool = False) -> int:
    """Checkpoint where every rank agreed to stop, wait for it, and exit to be requeued. `saved`:
    this step's checkpoint is saved already (it may still be writing in the background)."""
    if not s.cfg.exp_manager.create_checkpoint_callback:  # a requeue would start the run over
        s.log(
            f"stopping at iteration {s.state.step}: {reason}; checkpoints are off "
            "(exp_manager.create_checkpoint_callback=false): nothing saved, exit 0 (not requeued)"
        )
        return 0
    if not saved:
        save_checkpoint(s, waited_for=True)
    s.checkpoints.wait()
    due = validates_at(s, s.state.step) and s.state.validated_at != s.state.step
    left = "; its validation runs first when the run resumes" if due else ""
    s.log(f"stopping at iteration {s.state.step}: {reason}{left}; exit {EXIT_REQUEUE} to be requeued")
    return EXIT_REQUEUE


def saves_at(s: Session, step: int) -> bool:
    """A checkpoint is due after `step` (exp_manager.checkpoint_callback_params.every_n_train_steps)."""
    every = s.cfg.exp_manager.checkpoint_callback_params.every_n_train_steps
    return s.cfg.exp_manager.create_checkpoint_callback and bool(every) and step % every == 0


def validates_at(s: Session, step: int) -> bool:
    interval = s.cfg.trainer.val_check_interval
    return bool(interval) and step % interval == 0


def quiet_boundary(s: Session, step: int, logged: bool) -> bool:
    """Whether nothing after `step` needs the run's state exactly there (no log line, checkpoint,
    validation or end), so the next step may be queued before this one is read (StepRunner)."""
    return not (logged or step >= s.cfg.trainer.max_steps or saves_at(s, step) or validates_at(s, step))


def log_interval(s: Session, meter: IntervalMeter) -> None:
    """Print the iteration line (logging rank) and write the interval's dashboard scalars."""
    if s.device.type == "cuda":
        torch.cuda.synchronize(s.device)  # the interval's time must include its queued work
    m = s.cfg.model
    shape = RunShape(
        flops_per_iteration=s.flops_per_iteration,
        peak_tflops=s.peak_tflops,
        world_size=s.world.world_size,
        global_batch_size=m.global_batch_size,
        seq_length=m.data.seq_length,
        max_steps=s.cfg.trainer.max_steps,
    )
    report = interval_report(meter, s.state.step, s.state.consumed_samples, shape)
    if s.logging_rank:
        s.log(report.line)
    s.scalars.add(report.by_step, s.state.step)
    s.scalars.add_vs_samples(report.vs_samples, s.state.consumed_samples, s.state.step)


def record(s: Session, result: StepResult, samples: int | None = None) -> None:
    """Advance counters; samples are consumed even by skipped iterations (as Megatron).

    The schedule advances by the step's share of a full global batch: Megatron counts its learning
    rate in samples, so a ramp-up step of half the batch moves the schedule half a step.
    """
    st = s.state
    samples = s.cfg.model.global_batch_size if samples is None else samples
    st.step += 1
    st.consumed_samples += samples
    if result.updated:
        s.schedule.advance(samples / s.cfg.model.global_batch_size)
    st.skipped_iterations += int(not result.updated)
    st.nan_iterations += int(result.nonfinite)
    st.consecutive_nonfinite = st.consecutive_nonfinite + 1 if result.nonfinite else 0


def check_finite(s: Session, result: StepResult) -> None:
    """Stop the run after trainer.max_consecutive_nonfinite non-finite iterations in a row."""
    limit = s.cfg.trainer.max_consecutive_nonfinite
    if not result.nonfinite or s.state.consecutive_nonfinite < limit:
        return
    s.checkpoints.wait()  # a background save of a finite step is still the last good one
    last = s.checkpoints.newest()
    message = (
        f"loss or gradients not finite for {s.state.consecutive_nonfinite} iterations in a row "
        f"(last at iteration {s.state.step}); last good checkpoint: {last or 'none'}; "
        "lower model.optim.lr or raise trainer.max_consecutive_nonfinite"
    )
    s.log(message)
    raise TrainingDivergedError(message)


def evaluate(s: Session, data: GPTBatchDataset, num_batches: int) -> float:
    """Token-weighted mean loss over the first `num_batches` global batches of `data`."""
    m = s.cfg.model
    setup = EvalSetup(
        s.model, s.step_opts, s.device, m.micro_batch_size, s.num_microbatches, s.dp_rank, s.dp_size, m.seed
    )
    return evaluate_loss(setup, data, num_batches).loss


def validate(s: Session, data: GPTBatchDataset | None) -> None:
    """Megatron's validation block (skipped in benchmark mode, limit_val_batches=0)."""
    evaluate_split(s, data, s.cfg.trainer.limit_val_batches, "", TB_VAL_LOSS)
    s.state.validated_at = s.state.step


def agree_before_training(s: Session, agreement: StopAgreement, stop: StopRequest) -> str | None:
    """Whether every rank stops before the first step. Watched as the first step's boundary (its
    allowance: ranks end start-up at different times), so a rank stuck in start-up is named, not
    waited on until the collective timeout."""
    with s.watchdog.boundary(s.state.step + 1):
        return agreement.exchange(stop.signalled(), read_now=True)


def validate_if_left_due(s: Session, data: GPTBatchDataset | None) -> bool:
    """The validation of the step a run resumes at, when that run stopped before running it: a stop
    (SIGTERM, time limit) saves at once, before a validation due at the same step. Whether it ran
    (the same answer on every rank)."""
    step = s.state.step
    if step > 0 and validates_at(s, step) and s.state.validated_at != step:
        if has_batches(data, s.cfg.trainer.limit_val_batches):
            s.log(f"validation of iteration {step} was due when the run stopped: running it first")
        validate(s, data)
        return True
    return False


def has_batches(data: GPTBatchDataset | None, batches: int) -> bool:
    """Whether evaluate_split evaluates anything for this split and limit."""
    return data is not None and batches > 0 and len(data) > 0


def evaluate_split(s: Session, data: GPTBatchDataset | None, batches: int, where: str, tag: str) -> None:
    """Evaluate, print Megatron's block on the logging rank, send the loss to TensorBoard."""
    if not has_batches(data, batches):
        return
    loss = evaluate(s, data, batches)
    if s.logging_rank:
        for line in format_validation_lines(s.state.step, loss, where):
            s.log(line)
    s.scalars.add({tag: loss}, s.state.step)
    named = evaluation_scalars(loss, "valid" if tag == TB_VAL_LOSS else "test")  # Megatron's and NeMo's tags
    s.scalars.add(named, s.state.step)
    s.scalars.add_vs_samples(
        {f"{k} vs samples": v for k, v in named.items() if k.startswith("lm")},
        s.state.consumed_samples,
        s.state.step,
    )
