"""The validation and test splits' evaluations in a run: when they are due, Megatron's
lines and the dashboard scalars, and the test split a run resumed at max_steps still owes."""

from __future__ import annotations

from functools import partial
from pathlib import Path

from gptrain.checkpoint.agreement import rank_0s
from gptrain.checkpoint.directory import step_dir_name
from gptrain.checkpoint.retention import recorded_metric
from gptrain.train import saving
from gptrain.train.batches import GPTBatchDataset
from gptrain.train.evaluation import EvalSetup, StopCheck, evaluate_loss
from gptrain.train.logline import format_validation_lines
from gptrain.train.metrics import evaluation_scalars
from gptrain.train.results import TB_TEST_LOSS, TB_VAL_LOSS, record_test_done, tested_at
from gptrain.train.session import Session


def validates_at(s: Session, step: int) -> bool:
    interval = s.cfg.trainer.val_check_interval
    return bool(interval) and step % interval == 0


def validation_owed(s: Session, step: int) -> bool:
    """A validation due at `step` (on its interval, or the run's last) that has not run: a stop came
    before it, or during it, and saved without it. None is owed where validation is off."""
    t = s.cfg.trainer
    due = validates_at(s, step) or step == t.max_steps
    return step > 0 and due and t.limit_val_batches > 0 and s.state.validated_at != step


def validation_recorded(s: Session) -> bool:
    """Whether the COMPLETE of the checkpoint this run resumed from, at this step, records a validation
    loss: a run resumed from a stop's checkpoint ran the validation the stop left owed and recorded it
    there (saving.record_left_due_validation), with no save after it to carry `validated_at`."""
    resumed = s.checkpoints.resumed
    return (
        resumed is not None
        and resumed.name == step_dir_name(s.state.step)
        and recorded_metric(resumed, "val_loss") is not None
    )


def adopt_recorded_validation(s: Session) -> None:
    """The validation owed by the resumed checkpoint's state, which its COMPLETE records done
    (validation_recorded: an earlier resume of it ran the validation, then stopped again without a
    save), is not owed: it ran once. Every rank goes by rank 0's reading."""
    if validation_owed(s, s.state.step) and rank_0s(lambda: validation_recorded(s)):
        s.state.validated_at = s.state.step


def validation_blocks(s: Session, step: int) -> tuple[str, ...]:
    """The suffixes of Megatron's validation blocks for `step`: "" on the eval interval ('validation loss
    at iteration N'), " on validation set" for the validation after training, at trainer.max_steps.
    Where the end is on the interval Megatron evaluates twice and prints both; gptrain evaluates the
    same batches each time, so one evaluation prints both, with the loss a second would give."""
    at_end = step >= s.cfg.trainer.max_steps
    return ("",) * (validates_at(s, step) or not at_end) + (" on validation set",) * at_end


def has_batches(data: GPTBatchDataset | None, batches: int) -> bool:
    """Whether evaluate_split evaluates anything for this split and limit."""
    return data is not None and batches > 0 and len(data) > 0


def evaluate(
    s: Session,
    data: GPTBatchDataset,
    num_batches: int,
    stop_check: StopCheck | None = None,
    split: str = "validation",
) -> float:
    """Token-weighted mean loss over the first `num_batches` global batches of `data`, each watched
    by the hang watchdog as a step is."""
    m = s.cfg.model
    watch = partial(s.watchdog.evaluation, s.state.step, split)
    setup = EvalSetup(
        s.model,
        s.step_opts,
        s.device,
        m.micro_batch_size,
        s.num_microbatches,
        s.dp_rank,
        s.dp_size,
        m.seed,
        watch,
        partial(s.watchdog.doing, "loading its micro-batches"),
    )
    return evaluate_loss(setup, data, num_batches, stop_check).loss


def evaluate_split(
    s: Session,
    data: GPTBatchDataset | None,
    batches: int,
    blocks: tuple[str, ...],
    tag: str,
    stop_check: StopCheck | None = None,
) -> float | None:
    """Evaluate, print Megatron's block for each suffix of `blocks` on the logging rank, send the loss to TensorBoard; the loss
    (every rank has it), or None when there was nothing to evaluate. A stop agreed at one of its
    batches raises EvaluationStopped, with nothing printed or sent."""
    if not has_batches(data, batches):
        return None
    split = "test split" if tag == TB_TEST_LOSS else "validation"
    with s.doing(f"in the {split} of iteration {s.state.step}"):
        loss = evaluate(s, data, batches, stop_check, split)
    if s.logging_rank:
        for where in blocks:
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
    return loss


def validate(s: Session, data: GPTBatchDataset | None, stop_check: StopCheck | None = None) -> None:
    """Megatron's validation block (skipped in benchmark mode, limit_val_batches=0); its loss is kept
    for this step's save to record. Stopped (EvaluationStopped), it stays owed (validation_owed)."""
    blocks = validation_blocks(s, s.state.step)
    loss = evaluate_split(s, data, s.cfg.trainer.limit_val_batches, blocks, TB_VAL_LOSS, stop_check)
    s.validation = None if loss is None else (s.state.step, loss)
    s.state.validated_at = s.state.step


def validate_if_left_due(
    s: Session, data: GPTBatchDataset | None, stop_check: StopCheck | None = None
) -> bool:
    """The validation of the step a run resumes at, when that run stopped before running it or during
    it: a stop (SIGTERM, time limit) saves at once, before a validation due at the same step; its loss
    goes into that checkpoint's COMPLETE (saving.record_left_due_validation). Whether it ran (the same
    answer on every rank)."""
    step = s.state.step
    if validation_owed(s, step):
        if has_batches(data, s.cfg.trainer.limit_val_batches):
            s.log(f"validation of iteration {step} was due when the run stopped: running it first")
        validate(s, data, stop_check)
        saving.record_left_due_validation(s)
        return True
    return False


def evaluate_test_split(
    s: Session, data: GPTBatchDataset | None, stop_check: StopCheck | None = None
) -> None:
    """The test split at the end of the run (beside a background write of its last save, which is
    waited for), then recorded done, so a resume at max_steps does not evaluate it again. Stopped
    (EvaluationStopped), it is not recorded: the requeued run evaluates it."""
    evaluate_split(s, data, s.cfg.trainer.limit_test_batches, (" on test set",), TB_TEST_LOSS, stop_check)
    saving.wait_for_saves(s)
    if s.world.rank == 0 and has_batches(data, s.cfg.trainer.limit_test_batches):
        record_test_done(Path(s.cfg.exp_manager.explicit_log_dir), s.state.step)


def owed_at_max_steps(
    s: Session, valid_data: GPTBatchDataset | None, test_data: GPTBatchDataset | None
) -> tuple[bool, bool]:
    """(validation, test split) that a run resumed at trainer.max_steps still owes: the run that saved
    its checkpoint stopped before them or during them (a stop signal, a preemption, a kill or a failure
    right after its last save). The test split is owed unless the record of it done
    (results.record_test_done) names this iteration, as rank 0 reads it: every rank must evaluate, or
    none. With that record, nothing is owed (a checkpoint from before `validated_at` would otherwise
    validate again)."""
    step, t = s.state.step, s.cfg.trainer
    if rank_0s(lambda: tested_at(Path(s.cfg.exp_manager.explicit_log_dir))) == step:
        return False, False
    validation = validation_owed(s, step) and has_batches(valid_data, t.limit_val_batches)
    return validation, has_batches(test_data, t.limit_test_batches)


def finish_at_max_steps(
    s: Session,
    valid_data: GPTBatchDataset | None,
    test_data: GPTBatchDataset | None,
    owed: tuple[bool, bool],
    stop_check: StopCheck | None = None,
) -> int:
    """A run resumed at trainer.max_steps trains nothing, but runs the evaluations it `owed`
    (owed_at_max_steps), each once; EvaluationStopped where a stop gives them up again."""
    step, t = s.state.step, s.cfg.trainer
    validation, test = owed
    if not (validation or test):
        s.log(f"iteration {step} is already at trainer.max_steps={t.max_steps}: nothing to do")
        return 0
    what = " and ".join(["its validation"] * validation + ["the test split"] * test)
    s.log(
        f"iteration {step} is already at trainer.max_steps={t.max_steps}: evaluating {what},"
        " which the run stopped before"
    )
    if validation:
        validate(s, valid_data, stop_check)
        saving.record_left_due_validation(s)
    if test:
        evaluate_test_split(s, test_data, stop_check)
    return 0
