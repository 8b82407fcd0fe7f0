"""Stopping early (a signal, trainer.max_time): every rank agrees where, saves there and exits
to be requeued, or stops before the first step with nothing to save. trainer.exit_interval ends a
run at a step every rank knows alike, with exit 0."""

from __future__ import annotations

from gptrain.errors import EXIT_REQUEUE
from gptrain.train import eval_splits, saving
from gptrain.train.batches import GPTBatchDataset
from gptrain.train.evaluation import StopCheck
from gptrain.train.session import Session
from gptrain.train.signals import StopRequest
from gptrain.train.stop_agreement import StopAgreement


def agree_before_training(s: Session, agreement: StopAgreement, stop: StopRequest) -> str | None:
    """Whether every rank stops before the first step. Watched as the first step's boundary (its
    allowance: ranks end start-up at different times), so a rank stuck in start-up is named, not
    waited on until the collective timeout."""
    with s.watchdog.boundary(s.state.step + 1, "start"):
        return agreement.exchange(stop.signalled(), read_now=True)


def asked_during(s: Session, agreement: StopAgreement, stop: StopRequest) -> str | None:
    """A stop asked for while this step's save or validation ran, agreed by every rank now (they all
    saved or validated at this step). Slurm's warning signal most likely lands in the longest work
    of a step: left to the next step's end, it cost one more step and a second save in the time
    before the kill. No step is ever queued ahead of a save or validation (trainer.run_ahead), so
    the run can stop right here."""
    with s.watchdog.boundary(s.state.step), s.doing(f"at the end of iteration {s.state.step}"):
        return agreement.exchange(stop.reason(), read_now=True)


def during_evaluation(agreement: StopAgreement, stop: StopRequest, signals_only: bool = False) -> StopCheck:
    """The stop check of a validation or test split, before each of its global batches: Slurm's warning
    signal landing in one (at scale, minutes) stops it there, and the run saves and exits 75 instead of
    evaluating past the kill. Read a batch late on several ranks, as on unlogged steps (StopAgreement):
    a read at once would wait for each batch's forward before the next is queued. `signals_only`: for
    the evaluations a resumed run runs before its first step, where trainer.max_time is not yet a
    reason (a start-up longer than it would requeue for ever without a step)."""
    if signals_only:
        return lambda: agreement.exchange(stop.signalled(), read_now=False)
    return lambda: agreement.exchange(stop.reason(), read_now=False)


def stops_at_max_steps(
    s: Session, valid_data: GPTBatchDataset | None, test_data: GPTBatchDataset | None
) -> bool:
    """Whether a stop at trainer.max_steps (in its last step, its validation or the test split) ends
    the run there for a requeue. Not with checkpoints off: nothing is saved and nothing requeued, so
    the run finishes its evaluations, as it did before stops gave them up. Nor with no evaluation to
    leave to the requeued run (limit_val_batches=0 and no test split): it would only find the run
    finished; the run saves as usual and exits 0."""
    t = s.cfg.trainer
    owed = eval_splits.has_batches(valid_data, t.limit_val_batches) or eval_splits.has_batches(
        test_data, t.limit_test_batches
    )
    return s.cfg.exp_manager.create_checkpoint_callback and owed


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


def stop_for_requeue(
    s: Session,
    reason: str,
    saved: bool = False,
    test_owed: bool = False,
    validation_owed: bool | None = None,
) -> int:
    """Checkpoint where every rank agreed to stop, wait for it, and exit to be requeued. `saved`:
    this step's checkpoint is saved already (it may still be writing in the background). `test_owed`:
    at trainer.max_steps, the test split has not been evaluated (the requeued run does only that).
    `validation_owed`: whether the requeued run validates first, where this run validated after
    loading that checkpoint (None: as this run's state says, which its save records)."""
    if not s.cfg.exp_manager.create_checkpoint_callback:  # a requeue would start the run over
        s.log(
            f"stopping at iteration {s.state.step}: {reason}; checkpoints are off "
            "(exp_manager.create_checkpoint_callback=false): nothing saved, exit 0 (not requeued)"
        )
        return 0
    if not saved:
        saving.save_checkpoint(s, waited_for=True)
    saving.wait_for_saves(s)
    if validation_owed is None:
        validation_owed = eval_splits.validation_owed(s, s.state.step)
    left = left_to_the_resumed_run(s, validation_owed, test_owed)
    s.log(f"stopping at iteration {s.state.step}: {reason}{left}; exit {EXIT_REQUEUE} to be requeued")
    return EXIT_REQUEUE


def left_to_the_resumed_run(s: Session, validation_owed: bool, test_owed: bool) -> str:
    """What the stop leaves the requeued run to do before (or, at max_steps, instead of) training."""
    owed = ["its validation"] if validation_owed else []
    owed += ["the test split"] if test_owed else []
    if not owed:
        return ""
    if s.state.step < s.cfg.trainer.max_steps:
        return f"; {' and '.join(owed)} runs first when the run resumes"
    return f"; trained to trainer.max_steps: the resumed run only evaluates {' and '.join(owed)}"


def exits_at(s: Session, step: int) -> bool:
    """trainer.exit_interval (Megatron's --exit-interval) ends the run after `step`; at max_steps the
    run ends as usual instead (its validation, final save and test split)."""
    every = s.cfg.trainer.exit_interval
    return bool(every) and step % every == 0 and step < s.cfg.trainer.max_steps


def exit_at_interval(
    s: Session, saved: bool, stopped_for: str | None = None, validation_owed: bool = False
) -> int:
    """Save (unless this step's checkpoint is saved already, or checkpoints are off), wait for the
    write and exit 0, as Megatron does at its exit interval: not requeued, the same command resumes.
    `stopped_for`: a stop agreed at this same step, which ends the run here too."""
    saves = s.cfg.exp_manager.create_checkpoint_callback
    if saves and not saved:
        saving.save_checkpoint(s, waited_for=True)
    saving.wait_for_saves(s)
    kept = "; the same command resumes from its checkpoint" if saves else " (checkpoints are off)"
    also = f"; {stopped_for} at this iteration too" if stopped_for else ""
    left = left_to_the_resumed_run(s, validation_owed, test_owed=False) if saves else ""
    s.log(  # read by gptrain status (launch.log_endings.EXITED_AT_INTERVAL): its start stays as it is
        f"exiting at iteration {s.state.step}: trainer.exit_interval={s.cfg.trainer.exit_interval}"
        f"{kept}{also}{left}; exit 0"
    )
    return 0
