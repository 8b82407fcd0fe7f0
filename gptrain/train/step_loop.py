"""The step loop: iterate to trainer.max_steps; at each step boundary log, check, validate,
checkpoint, and stop where every rank agreed to."""

from __future__ import annotations

from collections.abc import Iterator
from functools import partial
from pathlib import Path

import torch

from gptrain.checkpoint.directory import step_dir_name
from gptrain.checkpoint.integrity import complete_steps
from gptrain.config import TrainingConfig
from gptrain.errors import DataError, GptrainError
from gptrain.train import eval_splits, saving, stopping
from gptrain.train.batches import GPTBatchDataset, build_loader, raise_if_a_worker_died, shut_down_workers
from gptrain.train.builders import log_memory
from gptrain.train.evaluation import EvaluationStopped, StopCheck
from gptrain.train.meter import (
    IntervalMeter,
    RunShape,
    dashboard_by_step,
    interval_report,
    iteration_scalars,
    timing_only,
)
from gptrain.train.overlap import StepRunner, can_run_ahead
from gptrain.train.results import forget_test_done
from gptrain.train.session import Session
from gptrain.train.signals import StopRequest
from gptrain.train.step import Batch, StepResult
from gptrain.train.step_times import StepTimes
from gptrain.train.stop_agreement import StopAgreement


class TrainingDivergedError(GptrainError):
    """The loss stayed non-finite for trainer.max_consecutive_nonfinite iterations."""


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
    agreement = StopAgreement()
    # with checkpoints off a stop gives no evaluation up: nothing is saved or requeued to finish it
    checkpoints_on = s.cfg.exp_manager.create_checkpoint_callback
    check = stopping.during_evaluation(agreement, stop) if checkpoints_on else None
    end_check = check if stopping.stops_at_max_steps(s, valid_data, test_data) else None  # at max_steps
    # before the first step a signal only: trainer.max_time still trains a step (StopRequest.signalled)
    start_check = stopping.during_evaluation(agreement, stop, signals_only=True) if checkpoints_on else None
    eval_splits.adopt_recorded_validation(s)
    if s.state.step >= t.max_steps:
        return finish_at_max_steps(s, valid_data, test_data, start_check if end_check else None)
    meter = IntervalMeter(start_step=s.state.step)
    times = StepTimes.open(Path(s.cfg.exp_manager.explicit_log_dir), s.world.rank, s.world.world_size)
    early = stopping.agree_before_training(s, agreement, stop)
    if early is not None:  # asked during start-up: not worth a validation the requeued run repeats
        return stopping.stop_before_training(s, early)
    # out of the first interval's time, as every validation is out of its own; agreed again after
    # it, so that a stop asked during it (the resumed run's longest work) ends the run before a step
    try:
        with meter.excluded(), times.excluded():
            validated = eval_splits.validate_if_left_due(s, valid_data, start_check)
    except EvaluationStopped as stopped:
        return stopping.stop_before_training(s, stopped.reason)
    early = stopping.agree_before_training(s, agreement, stop) if validated else None
    if early is not None:
        return stopping.stop_before_training(s, early)
    if s.world.rank == 0:
        forget_test_done(Path(s.cfg.exp_manager.explicit_log_dir))
    batches = microbatches(s, train_data)
    runner = StepRunner(s, batches, can_run_ahead(s))
    saved_at = -1
    tested = eval_splits.has_batches(test_data, t.limit_test_batches)  # after the last save, beside its write
    staging_prepared = False
    agreed_stop: str | None = None  # agreed while the next step was queued ahead: it finishes first
    while s.state.step < t.max_steps:
        end_if_interrupted(s, stop)
        step = s.state.step + 1
        # the first step, every log_every_n_steps, and the last: `status` and the curves end where the run did
        logged = step == meter.start_step + 1 or step % t.log_every_n_steps == 0 or step >= t.max_steps
        with s.watchdog.step(step):
            result, samples = runner.next(agreed_stop is None and quiet_boundary(s, step, logged))
        record(s, result, samples)
        if not staging_prepared:
            staging_prepared = saving.prepare_checkpoint_staging(s, result)
        s.checkpoints.poll()
        # Megatron prints the rate after the scheduler step: the one the next iteration uses
        meter.add(result, s.schedule.current_lr(), s.scaler.scale, samples)
        if (every := scalars_every(s)) is not None and step % every == 0:
            write_iteration_scalars(s, result, samples)
        # a log write on a hung mount holds every rank in the exchange
        with s.watchdog.boundary(step), s.doing(f"at the end of iteration {step}"):
            if logged:
                log_interval(s, meter)
            # Megatron's --log-memory-interval; the last iteration's is the end's report, after its validation
            if (every := s.cfg.trainer.log_memory_interval) and step % every == 0 and step < t.max_steps:
                log_memory(s.log, s.device, step)
                s.memory_reported_at = step
            reason = times.timed_sync(
                s.state.step,
                logged,
                partial(
                    agreement.exchange,
                    stop.reason(),
                    logged,
                    s.checkpoints.failure,
                    s.checkpoints.done_through,
                ),
            )
        s.checkpoints.report_done_through(agreement.done_everywhere)  # a save rank 0 marked, too
        check_finite(s, result, meter)  # its wait for a background write watched as a save
        agreed_stop = agreed_stop or reason
        last = s.state.step >= t.max_steps
        stoppable = not last or end_check is not None
        # with a step queued ahead: stop after it. At max_steps too: the final checkpoint first, the
        # end's validation and test split are left to the requeued run (the time left may not hold them)
        if agreed_stop is not None and not runner.ahead and stoppable:
            return stop_here(s, meter, agreed_stop, valid_data, test_owed=last and tested)
        validated = eval_splits.validates_at(s, s.state.step) or last
        if validated:  # before the save: the checkpoint records it done
            try:
                with meter.excluded(), times.excluded():
                    eval_splits.validate(s, valid_data, check if stoppable else None)
            except EvaluationStopped as stopped:  # given up for the stop: it stays owed
                return stop_here(s, meter, stopped.reason, valid_data, test_owed=last and tested)
        if saving.saves_at(s, s.state.step) and s.state.consecutive_nonfinite == 0:
            # not during a non-finite streak: the last good one stays newest
            with meter.excluded(), times.excluded():
                saving.save_checkpoint(s, waited_for=last and not tested)
            saved_at = s.state.step
        took_time = saved_at == s.state.step or (
            validated and eval_splits.has_batches(valid_data, t.limit_val_batches)
        )
        # at max_steps the test split's own stop check, at its first batch, takes a stop asked here
        if took_time and not last and (late := stopping.asked_during(s, agreement, stop)) is not None:
            return stop_here(s, meter, late, valid_data, saved=saved_at == s.state.step)
        if stopping.exits_at(s, s.state.step):
            if meter.iterations:
                log_interval(s, meter)
            return stopping.exit_at_interval(s, saved=saved_at == s.state.step)
    em = s.cfg.exp_manager
    if saved_at != s.state.step and em.create_checkpoint_callback and em.checkpoint_callback_params.save_last:
        saving.save_checkpoint(s, waited_for=not tested)
        saved_at = s.state.step
    try:
        eval_splits.evaluate_test_split(s, test_data, end_check)
    except EvaluationStopped as stopped:
        return stopping.stop_for_requeue(s, stopped.reason, saved=saved_at == s.state.step, test_owed=True)
    return 0


def stop_here(
    s: Session,
    meter: IntervalMeter,
    reason: str,
    valid_data: GPTBatchDataset | None,
    saved: bool = False,
    test_owed: bool = False,
) -> int:
    """Stop for a requeue at this step, its iterations since the last line logged first (their losses
    are not lost with the stop). The validation is said owed only where there is one to run. At an
    exit interval's step the run ends there anyway: exit 0, as the interval's, since a requeued job
    would train on past the step the run was asked to end at."""
    if meter.iterations:
        log_interval(s, meter)
    validation_owed = eval_splits.validation_owed(s, s.state.step) and eval_splits.has_batches(
        valid_data, s.cfg.trainer.limit_val_batches
    )
    if stopping.exits_at(s, s.state.step):
        return stopping.exit_at_interval(s, saved, stopped_for=reason, validation_owed=validation_owed)
    return stopping.stop_for_requeue(
        s, reason, saved=saved, test_owed=test_owed, validation_owed=validation_owed
    )


def finish_at_max_steps(
    s: Session,
    valid_data: GPTBatchDataset | None,
    test_data: GPTBatchDataset | None,
    check: StopCheck | None,
) -> int:
    """A run resumed at trainer.max_steps: the end's evaluations its stop left (eval_splits); a stop
    during them exits to be requeued again, its checkpoint complete already."""
    owed = eval_splits.owed_at_max_steps(s, valid_data, test_data)
    try:
        return eval_splits.finish_at_max_steps(s, valid_data, test_data, owed, check)
    except EvaluationStopped as stopped:  # what is left as the requeued run reads it from the checkpoint
        left = owed[0] and not eval_splits.validation_recorded(s)
        return stopping.stop_for_requeue(s, stopped.reason, True, test_owed=owed[1], validation_owed=left)


def end_if_interrupted(s: Session, stop: StopRequest) -> None:
    """A Ctrl-C held since the last step's end (StopRequest.holding_interrupts) ends the run here, as
    Ctrl-C ends any command: `gptrain: interrupted`, exit 130, nothing saved."""
    if not stop.interrupted:
        return
    newest = s.checkpoints.newest()
    s.log(
        f"interrupted (SIGINT) after iteration {s.state.step}: nothing saved, the newest checkpoint is "
        f"{newest or 'none'} (SIGUSR1 or SIGTERM save before stopping)"
    )
    raise KeyboardInterrupt


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
        except GptrainError:  # a sample's check (an id past the vocabulary), raised in a worker or here
            shut_down_workers(it)  # now: the error's frames hold `it`, and its workers, while it is kept
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


def quiet_boundary(s: Session, step: int, logged: bool) -> bool:
    """Whether nothing after `step` needs the run's state exactly there (no log line, checkpoint,
    validation or end), so the next step may be queued before this one is read (StepRunner)."""
    return not (
        logged
        or step >= s.cfg.trainer.max_steps
        or stopping.exits_at(s, step)
        or saving.saves_at(s, step)
        or eval_splits.validates_at(s, step)
    )


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
        log_throughput=s.cfg.trainer.log_throughput,
        ramp=s.batch_ramp(),
        log_every_n_steps=s.cfg.trainer.log_every_n_steps,
    )
    report = interval_report(meter, s.state.step, s.state.consumed_samples, shape)
    if s.logging_rank:
        s.log(report.line)
    by_step = dashboard_by_step(report)
    if scalars_every(s) is not None:  # the values went to the dashboards by iteration: the timing only
        s.scalars.add(timing_only(by_step), s.state.step)
        return
    s.scalars.add(by_step, s.state.step)
    s.scalars.add_vs_samples(report.vs_samples, s.state.consumed_samples, s.state.step)


def scalars_every(s: Session) -> int | None:
    """trainer.tensorboard_log_interval: TensorBoard and W&B get every such iteration's own values, as
    Megatron writes them, also where it equals log_every_n_steps. None (unset): the printed line's
    values, the loss its mean over the interval."""
    return s.cfg.trainer.tensorboard_log_interval


def write_iteration_scalars(s: Session, result: StepResult, samples: int) -> None:
    """This iteration's own values to the dashboards. The host holds them already (every step's loss
    and grad norm are read once, trainer.run_ahead or not): no device sync, only the writes."""
    st = s.state
    by_step, vs_samples = iteration_scalars(
        result,
        s.schedule.current_lr(),
        s.scaler.scale,
        samples,
        st.step,
        st.consumed_samples,
        s.world.world_size,
    )
    s.scalars.add(by_step, st.step)
    s.scalars.add_vs_samples(vs_samples, st.consumed_samples, st.step)


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
    st.nan_iterations += int(result.nan)  # as the iteration line counts them
    st.consecutive_nonfinite = st.consecutive_nonfinite + 1 if result.nonfinite else 0


def check_finite(s: Session, result: StepResult, meter: IntervalMeter) -> None:
    """Name each non-finite iteration, which is skipped (the iteration line only counts them), and
    stop the run after trainer.max_consecutive_nonfinite of them in a row, the iterations since the
    last line logged first (the losses before the divergence are what tells its cause). The stop line
    carries the last one's values: it has no warning (with a limit of 1, none has). Its log writes and
    checkpoint listing are watched (a hung shared file system), its wait for a background write as a save."""
    limit = s.cfg.trainer.max_consecutive_nonfinite
    if not result.nonfinite:
        return
    if s.state.consecutive_nonfinite < limit:
        with s.watchdog.boundary(s.state.step):
            s.log(
                f"warning: iteration {s.state.step} skipped: loss or gradients not finite ({nonfinite_values(result)}); "
                f"{s.state.consecutive_nonfinite} in a row, trainer.max_consecutive_nonfinite={limit} in a row stop the run"
            )
        return
    if meter.iterations:
        with s.watchdog.boundary(s.state.step):
            log_interval(s, meter)
    saving.wait_for_saves(s)  # a background save of a finite step is still the last good one
    with s.watchdog.boundary(s.state.step):
        message = (
            f"loss or gradients not finite for {s.state.consecutive_nonfinite} iterations in a row "
            f"(last at iteration {s.state.step}: {nonfinite_values(result)}); "
            f"last good checkpoint: {last_good_checkpoint(s)}; "
            f"{nonfinite_advice(s.cfg)} or raise trainer.max_consecutive_nonfinite"
        )
        s.log(message)
    raise TrainingDivergedError(message)


def last_good_checkpoint(s: Session) -> str:
    """The newest checkpoint from before the streak. An exit interval's or a stop's save is made inside
    one too (a resumed run's streak goes on from the count its checkpoint recorded): such a checkpoint
    is named apart, with the weights it holds, those of the streak's last finite iteration (skipped
    iterations update nothing)."""
    good_until = s.state.step - s.state.consecutive_nonfinite  # the streak's last finite iteration
    steps = complete_steps(s.checkpoints.root)
    good = [step for step in steps if step <= good_until]
    named = str(s.checkpoints.root / step_dir_name(good[-1])) if good else "none"
    if steps and steps[-1] > good_until:
        named += (
            f" ({step_dir_name(steps[-1])}, saved inside the streak, holds iteration {good_until}'s weights)"
        )
    return named


def nonfinite_values(result: StepResult) -> str:
    """The step's loss and grad norm as read (a non-finite loss leaves the norm unread)."""
    norm = "" if result.grad_norm is None else f", grad norm {result.grad_norm:g}"
    return f"lm loss {result.loss:g}{norm}"


def nonfinite_advice(cfg: TrainingConfig) -> str:
    """What to lower: under fp16's static scale (Megatron's --loss-scale) the usual cause is a scale
    whose scaled gradients overflow fp16 on every step, not the learning rate."""
    if cfg.trainer.precision == "16" and cfg.model.native_amp_static_scale:  # normalize.py normalized it
        return f"lower model.native_amp_init_scale ({cfg.model.native_amp_init_scale:g}) or model.optim.lr"
    return "lower model.optim.lr"
