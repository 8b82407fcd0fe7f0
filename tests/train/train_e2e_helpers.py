"""Run `train(cfg)` in-process on a tiny GPT and record every iteration's exact loss."""

import os
import signal
from pathlib import Path

from gptrain.config import load_training_config
from gptrain.train import eval_splits, loop, step_loop

TINY = [
    "trainer.accelerator=cpu",
    "trainer.precision=32",
    "trainer.num_nodes=1",
    "trainer.devices=1",
    "trainer.max_time=null",
    "trainer.max_steps=6",
    "trainer.log_every_n_steps=1",
    "trainer.val_check_interval=3",
    "trainer.limit_val_batches=1",
    # the test split's default 50 global batches were ~40% of a tiny run's time; 3 still leave
    # batches after the first for a stop inside it to give up
    "trainer.limit_test_batches=3",
    "model.num_layers=2",
    "model.hidden_size=32",
    "model.num_attention_heads=4",
    "model.encoder_seq_length=16",
    "model.micro_batch_size=2",
    "model.global_batch_size=4",
    "model.hidden_dropout=0.1",
    "model.attention_dropout=0.1",
    "model.data.num_workers=0",
    "model.optim.sched.warmup_steps=2",
    "model.optim.sched.constant_steps=0",
    "exp_manager.checkpoint_callback_params.every_n_train_steps=2",
    "exp_manager.checkpoint_callback_params.save_top_k=2",
]
MOCK = ["model.data.data_impl=mock", "model.data.mock_vocab_size=100", "model.data.data_prefix=null"]
# For trainer.run_ahead: the boundaries that need the state (log 1, 5, 10; save 4, 8, 12; validate 6,
# 12; the end 12) leave steps 2, 3, 7, 9 and 11 to queue their next step ahead.
RUN_AHEAD_SHAPE = [
    "trainer.max_steps=12",
    "trainer.log_every_n_steps=5",
    "trainer.val_check_interval=6",
    "exp_manager.checkpoint_callback_params.every_n_train_steps=4",
    "exp_manager.checkpoint_callback_params.save_top_k=5",
]
RUNS_AHEAD_AFTER = [2, 3, 7, 9, 11]


def tiny_config(log_dir: Path, *overrides: str):
    return load_training_config("gpt3/126m", [*TINY, f"exp_manager.explicit_log_dir={log_dir}", *overrides])


def run_recording(monkeypatch, cfg, signal_at: int | None = None) -> tuple[int, dict[int, float]]:
    """train(cfg) -> (exit code, {iteration: loss}); optionally SIGUSR1 ourselves during `signal_at`."""
    losses: dict[int, float] = {}
    real_record = step_loop.record

    def recording(session, result, *args):
        real_record(session, result, *args)
        losses[session.state.step] = result.loss
        if session.state.step == signal_at:
            os.kill(os.getpid(), signal.SIGUSR1)

    monkeypatch.setattr(step_loop, "record", recording)
    code = loop.train(cfg)
    monkeypatch.setattr(step_loop, "record", real_record)
    return code, losses


def log_lines(log_dir: Path) -> list[str]:
    return (log_dir / "nemo_log_globalrank-0_localrank-0.txt").read_text().splitlines()


def record_runs_ahead(set_attribute=setattr) -> list[int]:
    """The steps after which trainer.run_ahead queued the next one: StepRunner.next wrapped through
    `set_attribute` (monkeypatch.setattr in a test; plain setattr in a worker process)."""
    from gptrain.train import overlap

    ahead: list[int] = []
    real_next = overlap.StepRunner.next

    def recording_next(runner, may_run_ahead):
        result = real_next(runner, may_run_ahead)
        if runner.ahead:
            ahead.append(runner.s.state.step + 1)
        return result

    set_attribute(overlap.StepRunner, "next", recording_next)
    return ahead


class Preempted(Exception):
    """The job ended (a preemption, a time limit's SIGKILL) right after the last save."""


def preempted_at_the_test_split(monkeypatch) -> None:
    """Runs end with Preempted where their test split would start (after the last save)."""
    from gptrain.train.results import TB_TEST_LOSS

    real_evaluate_split = eval_splits.evaluate_split

    def evaluate_split(s, data, batches, where, tag, *stop_check):
        if tag == TB_TEST_LOSS:
            raise Preempted
        return real_evaluate_split(s, data, batches, where, tag, *stop_check)

    monkeypatch.setattr(eval_splits, "evaluate_split", evaluate_split)


def signal_inside_evaluation(monkeypatch, tag: str, at_step: int) -> list[int]:
    """SIGUSR1 to this process once the first micro-batch of the `tag` evaluation (TB_VAL_LOSS: the
    validation, TB_TEST_LOSS: the test split) at iteration `at_step` has gone through the model, as
    Slurm's warning signal lands inside a long evaluation. Returns the micro-batches each evaluation
    of that split took in, in order (signalled or not)."""
    from gptrain.train import evaluation

    taken: list[int] = []
    inside = {"signalled": False, "step": None}
    real_split, real_to_device = eval_splits.evaluate_split, evaluation.to_device

    def evaluate_split(s, data, batches, where, split_tag, *stop_check):
        if split_tag != tag:
            return real_split(s, data, batches, where, split_tag, *stop_check)
        taken.append(0)
        inside["step"] = s.state.step
        try:
            return real_split(s, data, batches, where, split_tag, *stop_check)
        finally:
            inside["step"] = None

    def to_device(batch, device):
        if inside["step"] is not None:
            taken[-1] += 1
            if inside["step"] == at_step and not inside["signalled"]:
                inside["signalled"] = True
                os.kill(os.getpid(), signal.SIGUSR1)
        return real_to_device(batch, device)

    monkeypatch.setattr(eval_splits, "evaluate_split", evaluate_split)
    monkeypatch.setattr(evaluation, "to_device", to_device)
    return taken
