"""The validation and test splits' evaluations in a run: when they are due, Megatron's
lines and the dashboard scalars, and the test split a run resumed at max_steps still owes."""

from __future__ import annotations

from pathlib import Path

from gptrain.checkpoint.reader import rank_0s
from gptrain.train import saving
from gptrain.train.batches import GPTBatchDataset
from gptrain.train.evaluation import EvalSetup, evaluate_loss
from gptrain.train.logline import format_validation_lines
from gptrain.train.metrics import evaluation_scalars
from gptrain.train.results import TB_TEST_LOSS, TB_VAL_LOSS, record_test_done, tested_at
from gptrain.train.session import Session


def validates_at(s: Session, step: int) -> bool:
    interval = s.cfg.trainer.val_check_interval
    return bool(interval) and step % interval == 0


def has_batches(data: GPTBatchDataset | None, batches: int) -> bool:
    """Whether evaluate_split evaluates anything for this split and limit."""
    return data is not None and batches > 0 and len(data) > 0


def evaluate(s: Session, data: GPTBatchDataset, num_batches: int) -> float:
    """Token-weighted mean loss over the first `num_batches` global batches of `data`."""
    m = s.cfg.model
    setup = EvalSetup(
        s.model, s.step_opts, s.device, m.micro_batch_size, s.num_microbatches, s.dp_rank, s.dp_size, m.seed
    )
    return evaluate_loss(setup, data, num_batches).loss


def evaluate_split(
    s: Session, data: GPTBatchDataset | None, batches: int, where: str, tag: str
) -> float | None:
    """Evaluate, print Megatron's block on the logging rank, send the loss to TensorBoard; the loss
    (every rank has it), or None when there was nothing to evaluate."""
    if not has_batches(data, batches):
        return None
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
    return loss


def validate(s: Session, data: GPTBatchDataset | None) -> None:
    """Megatron's validation block (skipped in benchmark mode, limit_val_batches=0); its loss is kept
    for this step's save to record."""
    loss = evaluate_split(s, data, s.cfg.trainer.limit_val_batches, "", TB_VAL_LOSS)
    s.validation = None if loss is None else (s.state.step, loss)
    s.state.validated_at = s.state.step


def validate_if_left_due(s: Session, data: GPTBatchDataset | None) -> bool:
    """The validation of the step a run resumes at, when that run stopped before running it: a stop
    (SIGTERM, time limit) saves at once, before a validation due at the same step; its loss goes into
    that checkpoint's COMPLETE (saving.record_left_due_validation). Whether it ran (the same answer on
    every rank)."""
    step = s.state.step
    if step > 0 and validates_at(s, step) and s.state.validated_at != step:
        if has_batches(data, s.cfg.trainer.limit_val_batches):
            s.log(f"validation of iteration {step} was due when the run stopped: running it first")
        validate(s, data)
        saving.record_left_due_validation(s)
        return True
    return False


def evaluate_test_split(s: Session, data: GPTBatchDataset | None) -> None:
    """The test split at the end of the run (beside a background write of its last save, which is
    waited for), then recorded done, so a resume at max_steps does not evaluate it again."""
    evaluate_split(s, data, s.cfg.trainer.limit_test_batches, " on test set", TB_TEST_LOSS)
    s.checkpoints.wait()
    if s.world.rank == 0 and has_batches(data, s.cfg.trainer.limit_test_batches):
        record_test_done(Path(s.cfg.exp_manager.explicit_log_dir), s.state.step)


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
