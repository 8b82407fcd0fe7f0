"""The run: `train(cfg)` reads top to bottom: claim the run directory, build the pieces, resume,
run the steps, and shut down (a failure said in one line). Its parts live beside it:
  session       the live pieces one run's functions share (Session)
  resuming      where the run starts from: its own newest checkpoint, or another run's
  step_loop     the steps to trainer.max_steps (run)
  eval_splits   validation and the test split
  saving        checkpoint saves and their reports
  stopping      stopping early for a requeue, at a step every rank agreed on; trainer.exit_interval
  peer_loss     a collective that lost its peer, in one line

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
from pathlib import Path

import torch

from gptrain.checkpoint.agreement import rank_0s
from gptrain.config import TrainingConfig
from gptrain.config.yamlio import dump_config
from gptrain.data.blend_spec import check_data_prefix
from gptrain.errors import EXIT_REQUEUE, GptrainError, error_text, find_out_of_memory
from gptrain.parallel.layout import STARTED, check_layout
from gptrain.parallel.mesh import init_distributed, shutdown, started_layout, world_from_env
from gptrain.parallel.parallelize import check_parallel_choices
from gptrain.parallel.rng import stream_warnings
from gptrain.train import builders as b
from gptrain.train import peer_loss, resuming, saving, step_loop, tokenizer_setup
from gptrain.train.batches import loader_worker_died
from gptrain.train.earlier_run import requeued_own_checkpoint
from gptrain.train.memory_check import out_of_memory, start_warning
from gptrain.train.results import RunLog, Scalars, run_record, started_layout_note, write_run_files
from gptrain.train.run_directory import claim_run_directory
from gptrain.train.schedule import ScheduleSpec
from gptrain.train.schedule_checks import following_this_config, names_in_config, run_schedule_warnings
from gptrain.train.session import ScheduleNaming, Session
from gptrain.train.signals import StopRequest
from gptrain.train.target_sizes import built_split_keys
from gptrain.train.wandb_logger import WandbRun, require_wandb
from gptrain.train.watchdog import Watchdog, collective_timeout_minutes


def train(
    cfg: TrainingConfig,
    schedule_names: ScheduleNaming = names_in_config,
    *,
    process_exits: bool = False,
) -> int:
    """Train as configured; 0 at max_steps, EXIT_REQUEUE after a signal or max_time checkpoint.
    `schedule_names`: `gptrain megatron` names its flags in the start warnings, not the config's keys.
    `process_exits`: the process exits when this returns (the CLI, a rank), so after a stop for a
    requeue SIGTERM/SIGUSR1 stay ignored to the end; otherwise the caller gets its handlers back.
    trainer.max_time counts from the command's start (signals.command_start)."""
    require_wandb(cfg)  # on every rank, before any of them starts
    world = world_from_env()
    started = started_layout()  # what runs, where trainer.num_nodes x devices says otherwise
    # A layout the started processes cannot hold is one line before any rendezvous: with a peer
    # that never joins, the process group would wait for it instead.
    check_layout(cfg.model, world.world_size, cfg.trainer.devices, STARTED)
    check_parallel_choices(cfg)
    if not b.is_mock_data(
        cfg
    ):  # a bad blend or a missing prefix is one line now, not after the model is built
        check_data_prefix(cfg.model.data.data_prefix, splits=built_split_keys(cfg))
    if world.world_size > 1:
        # collectives outlive the hang watchdog, so that it, not an opaque timeout, names a stuck rank
        timeout = collective_timeout_minutes(cfg.trainer.hang_timeout_minutes)
        init_distributed(world, cfg.trainer.resolved_accelerator(), timeout)
    log_dir = Path(cfg.exp_manager.explicit_log_dir)
    em = cfg.exp_manager  # one run per directory, claimed before anything is written into it
    # as rank 0 sees it: a rank whose stale listing lacks the checkpoint would not resume
    checkpoints = Path(em.checkpoints_dir)
    own = None if em.resume_if_exists else rank_0s(lambda: requeued_own_checkpoint(checkpoints))
    if own is not None:  # the job that wrote it, requeued: the same run, which resumes
        em.resume_if_exists = True
    run_lock = claim_run_directory(
        log_dir,
        world.rank,
        world.world_size,
        em.resume_if_exists,
        em.move_aside_earlier_run,
        saves=em.create_checkpoint_callback,
        checkpoints=checkpoints,
        start_from=em.resume_from_checkpoint,
    )
    if own is not None:
        run_lock.notes.append(
            f"exp_manager.resume_if_exists=false, but this is Slurm job {os.environ['SLURM_JOB_ID']} "
            f"requeued and {own} is its own checkpoint: resuming it"
        )
    if note := started_layout_note(cfg, started):
        run_lock.notes.append(note)
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
        source = resuming.checkpoint_to_start_from(
            cfg
        )  # a wrong path fails now, not after the model is built
        if logging_rank and cfg.exp_manager.create_wandb_logger:
            scalars.send_to_wandb(WandbRun.start(cfg, run_record(cfg, started)))
        device = b.select_device(cfg, world)
        b.seed_everything(b.dropout_seed(cfg, world))
        tokenizer = tokenizer_setup.build_tokenizer(cfg)
        vocab, padded_vocab = tokenizer_setup.padded_vocab_size(cfg, tokenizer)
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
            schedule=b.build_schedule(cfg, optimizer),
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
        saving.watch_checkpoint_saves(session)
        train_data, valid_data, test_data = b.build_datasets(
            cfg, vocab, tokenizer, world.local_rank, note=log
        )
        session.train_split = getattr(train_data, "samples", None)
        session.train_built_for = getattr(train_data, "built_for", None)
        session.valid_split = getattr(valid_data, "samples", None)
        log_start(session, model_config, log_dir, schedule_names)
        config_schedule = session.schedule.spec
        with session.doing("while loading the checkpoint to start from"):
            resuming.resume(session, source)
        if cfg.model.optim.sched.from_checkpoint:  # the schedule the resume took, not the config's
            log_schedule_warnings(session, schedule_names, config_schedule)
        if world.rank == 0:  # after the resume: a config its checkpoint refused must not replace the run's
            write_run_files(log_dir, dump_config(run_record(cfg, started)), checkpoints=checkpoints)
        for line in b.megatron_start_lines(cfg, vocab, model_config, dp_size):
            session.log(line)
        for line in b.built_split_lines((train_data, valid_data, test_data)):
            session.log(line)
        with stop.holding_interrupts(enabled=world.world_size == 1):
            code = step_loop.run(session, train_data, valid_data, test_data, stop)
        requeue = code == EXIT_REQUEUE
        session.checkpoints.close()  # old checkpoints are removed in the background: let that finish
        if session.memory_reported_at != session.state.step:  # a stop at a reported iteration: reported
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
        elif (lost := peer_loss.lost_a_peer(error, world, watchdog, session)) is not None:
            final = lost
        if isinstance(final, GptrainError):  # the run's log says why it ended, as the console does
            log.to_file(f"gptrain: error: {error_text(final)}")
        if final is error:
            raise
        raise final from None
    finally:
        try:
            watchdog.close()
            if failed and session is not None:
                saving.finish_saves_after_failure(session)
            run_lock.release()
            # a run stopped for a requeue exits 75, not of a SIGTERM during its shutdown (srun's when
            # another rank has exited, Slurm's at the time limit after its warning signal)
            stop.uninstall(keep_ignoring=requeue)
            scalars.close()
            log.close()
            if world.world_size > 1:
                shutdown(wait_for_peers=not failed)  # peers may be stuck in a collective: do not wait
        finally:  # also when a close above raised: a caller that goes on must not keep them ignored
            if not process_exits:  # the shutdown the signals were ignored for is over
                stop.stop_ignoring()


def log_schedule_warnings(s: Session, schedule_names: ScheduleNaming, config_schedule: ScheduleSpec) -> None:
    """The learning-rate schedule's start warnings, of the schedule the run follows: with
    model.optim.sched.from_checkpoint that is the one a resume took from its checkpoint (the
    config's `config_schedule` otherwise), whose warning says so: the config's keys do not change it."""
    spec, taken = s.schedule.spec, ""
    names = schedule_names(s.cfg, spec)
    if spec != config_schedule:
        taken = " (the checkpoint's schedule: model.optim.sched.from_checkpoint=true; false to follow this config's)"
        names = following_this_config(names)
    for warning in run_schedule_warnings(s.cfg, spec, names):
        s.log(f"warning: {warning}{taken}")


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
        f"{s.num_microbatches} microbatch{'' if s.num_microbatches == 1 else 'es'} per step | results in {log_dir}"
    )
    if not s.cfg.model.optim.sched.from_checkpoint:  # else said once the resume took its schedule
        log_schedule_warnings(s, schedule_names, s.schedule.spec)
    retention = saving.retention_warning(s.cfg)
    for warning in stream_warnings(s.cfg.model) + ([retention] if retention else []):
        s.log(f"warning: {warning}")
    # fp32 weights and AdamW's two moments: 12 bytes a parameter, whatever the layout. Said by the
    # logging rank (the console's: rank 0's own lines go to its file only) and by rank 0.
    checkpointing = s.cfg.exp_manager.create_checkpoint_callback
    says = s.world.rank == 0 or s.logging_rank
    space = s.checkpoints.space_warning(12 * params) if says and checkpointing else None
    if space is not None:
        s.log(f"warning: {space}")
