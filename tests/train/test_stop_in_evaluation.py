"""A stop (Slurm's warning signal) inside a validation, in the last step or inside the final test split.

Before: a validation ran to its end, however long, before the run saved and stopped; at
trainer.max_steps the signal was ignored on purpose, so the run validated, saved and evaluated the
whole test split, and where that took longer than cluster.signal_seconds Slurm killed the job at its
time limit: TIMEOUT, not requeued, the test result lost. Now an evaluation is given up at its next
global batch, the run saves (the final checkpoint, bit-exact) and exits 75; the requeued run resumed at
max_steps runs only the evaluations left, each once (log lines, TensorBoard, test_split_done.txt).
"""

from pathlib import Path

import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from train_e2e_helpers import MOCK, log_lines, run_recording, signal_inside_evaluation, tiny_config

from gptrain.checkpoint.integrity import complete_steps
from gptrain.errors import EXIT_REQUEUE
from gptrain.train.results import TB_TEST_LOSS, TB_VAL_LOSS, TEST_DONE

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")

VALIDATES_3 = "trainer.limit_val_batches=3"  # TINY validates one batch: three, to stop inside one
MICROBATCHES = 2  # of each global batch: model.global_batch_size=4 / model.micro_batch_size=2
END_LEFT = (
    "stopping at iteration 6: received SIGUSR1; trained to trainer.max_steps: the resumed run only evaluates"
)


def config(log_dir: Path, *overrides: str):
    return tiny_config(log_dir, *MOCK, VALIDATES_3, *overrides)


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    """One full 6-step run (validation at 3 and 6, the test split at 6) shared by the tests below."""
    log_dir = tmp_path_factory.mktemp("full")
    with pytest.MonkeyPatch.context() as mp:
        code, losses = run_recording(mp, config(log_dir))
    assert code == 0
    return log_dir, losses


def evaluation_lines(log_dir: Path) -> list[str]:
    """Megatron's validation and test split lines ('validation loss at iteration N [on test set] | ...')."""
    return [line for line in log_lines(log_dir) if "validation loss at iteration" in line]


def scalars(log_dir: Path, tag: str) -> list[tuple[int, float]]:
    return [(e.step, e.value) for e in EventAccumulator(str(log_dir)).Reload().Scalars(tag)]


def final_weights(log_dir: Path) -> dict[str, torch.Tensor]:
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    target = log_dir / "weights_6.pt"
    dcp_to_torch_save(log_dir / "checkpoints" / "step_6", target)
    return torch.load(target, weights_only=False)["model"]


def assert_the_end_as_uninterrupted(log_dir: Path, full_dir: Path) -> None:
    """Every evaluation once, with the uninterrupted run's losses, in the log and TensorBoard; the final
    checkpoint the uninterrupted run's, bit for bit."""
    assert evaluation_lines(log_dir) == evaluation_lines(full_dir)
    for tag in (TB_VAL_LOSS, TB_TEST_LOSS):
        assert scalars(log_dir, tag) == scalars(full_dir, tag), tag
    assert (log_dir / TEST_DONE).read_text() == "6\n"
    resumed, full = final_weights(log_dir), final_weights(full_dir)
    assert all(torch.equal(resumed[k], full[k]) for k in full)


def test_a_stop_inside_a_validation_gives_it_up_at_its_next_batch_and_saves(
    uninterrupted, tmp_path, monkeypatch
):
    """It ran all of its batches first (at scale, minutes of the signal's lead); now one."""
    full_dir, full_losses = uninterrupted
    taken = signal_inside_evaluation(monkeypatch, TB_VAL_LOSS, at_step=3)
    code, first = run_recording(monkeypatch, config(tmp_path))
    monkeypatch.undo()
    assert code == EXIT_REQUEUE and sorted(first) == [1, 2, 3]
    assert taken == [MICROBATCHES]  # its first global batch of 3, then the stop
    assert complete_steps(tmp_path / "checkpoints")[-1] == 3
    assert evaluation_lines(tmp_path) == []
    assert log_lines(tmp_path)[-1] == (
        "stopping at iteration 3: received SIGUSR1; its validation runs first when the run resumes;"
        " exit 75 to be requeued"
    )
    code, second = run_recording(monkeypatch, config(tmp_path))
    assert code == 0 and sorted(second) == [4, 5, 6]
    assert "validation of iteration 3 was due when the run stopped: running it first" in log_lines(tmp_path)
    assert evaluation_lines(tmp_path) == evaluation_lines(full_dir)
    for step in range(1, 7):
        assert (first | second)[step] == full_losses[step], step


@pytest.mark.parametrize("where", ["in the last step", "inside its validation"])
def test_a_stop_at_the_last_step_saves_it_and_the_resume_only_evaluates(
    uninterrupted, tmp_path, monkeypatch, where
):
    full_dir, full_losses = uninterrupted
    if where == "inside its validation":
        taken = signal_inside_evaluation(monkeypatch, TB_VAL_LOSS, at_step=6)
        code, first = run_recording(monkeypatch, config(tmp_path))
        assert taken == [3 * MICROBATCHES, MICROBATCHES]  # iteration 3's whole, 6's first batch
    else:
        code, first = run_recording(monkeypatch, config(tmp_path), signal_at=6)
    monkeypatch.undo()
    assert code == EXIT_REQUEUE and first == full_losses
    assert complete_steps(tmp_path / "checkpoints")[-1] == 6
    assert [line for line in evaluation_lines(tmp_path) if "iteration 6" in line] == []
    assert not (tmp_path / TEST_DONE).exists()
    assert log_lines(tmp_path)[-1] == (
        f"{END_LEFT} its validation and the test split; exit 75 to be requeued"
    )
    assert run_recording(monkeypatch, config(tmp_path)) == (0, {})  # nothing trained
    assert (
        "iteration 6 is already at trainer.max_steps=6: evaluating its validation and the test split,"
        " which the run stopped before"
    ) in log_lines(tmp_path)
    assert any(
        line.startswith("recorded val_loss ") and "in step_6's COMPLETE" in line
        for line in log_lines(tmp_path)
    )
    assert_the_end_as_uninterrupted(tmp_path, full_dir)
    assert run_recording(monkeypatch, config(tmp_path)) == (0, {})
    assert "already at trainer.max_steps=6: nothing to do" in log_lines(tmp_path)[-1]


@pytest.mark.parametrize("async_save", ["false", "true"])
def test_a_stop_inside_the_final_test_split_exits_75_and_the_resume_evaluates_only_it(
    uninterrupted, tmp_path, monkeypatch, async_save
):
    """The final save is written (in the background beside the test split, with async_save) before the
    exit; a second stop, inside the resumed run's test split, exits 75 again with nothing to save."""
    full_dir, full_losses = uninterrupted
    saving = f"exp_manager.checkpoint_callback_params.async_save={async_save}"
    taken = signal_inside_evaluation(monkeypatch, TB_TEST_LOSS, at_step=6)
    code, first = run_recording(monkeypatch, config(tmp_path, saving))
    monkeypatch.undo()
    assert code == EXIT_REQUEUE and first == full_losses and taken == [MICROBATCHES]
    assert complete_steps(tmp_path / "checkpoints")[-1] == 6
    assert [line for line in evaluation_lines(tmp_path) if "test set" in line] == []
    assert not (tmp_path / TEST_DONE).exists()
    assert log_lines(tmp_path)[-1] == f"{END_LEFT} the test split; exit 75 to be requeued"
    taken = signal_inside_evaluation(monkeypatch, TB_TEST_LOSS, at_step=6)
    assert run_recording(monkeypatch, config(tmp_path, saving)) == (EXIT_REQUEUE, {})
    monkeypatch.undo()
    assert (
        taken == [MICROBATCHES]
        and log_lines(tmp_path)[-1] == f"{END_LEFT} the test split; exit 75 to be requeued"
    )
    assert complete_steps(tmp_path / "checkpoints")[-1] == 6 and not (tmp_path / TEST_DONE).exists()
    assert run_recording(monkeypatch, config(tmp_path, saving)) == (0, {})
    said = "iteration 6 is already at trainer.max_steps=6: evaluating the test split, which the run stopped before"
    assert log_lines(tmp_path).count(said) == 2  # the two resumed runs
    assert_the_end_as_uninterrupted(tmp_path, full_dir)


@pytest.mark.parametrize("where", ["in the last step", "inside its validation", "inside the test split"])
def test_with_checkpoints_off_a_stop_at_the_last_step_still_runs_the_evaluations(
    uninterrupted, tmp_path, monkeypatch, where
):
    """Nothing is saved and nothing requeued with checkpoints off: giving the evaluations up gained
    nothing and lost the run's validation and test results (exit 0, the lines never printed)."""
    full_dir, full_losses = uninterrupted
    off = config(tmp_path, "exp_manager.create_checkpoint_callback=false")
    if where == "in the last step":
        code, losses = run_recording(monkeypatch, off, signal_at=6)
    else:
        tag = TB_VAL_LOSS if where == "inside its validation" else TB_TEST_LOSS
        taken = signal_inside_evaluation(monkeypatch, tag, at_step=6)
        code, losses = run_recording(monkeypatch, off)
        assert taken[-1] > MICROBATCHES  # on past its first batch (the lines below: to its end)
    monkeypatch.undo()
    assert code == 0 and losses == full_losses
    assert evaluation_lines(tmp_path) == evaluation_lines(full_dir)
    for tag in (TB_VAL_LOSS, TB_TEST_LOSS):
        assert scalars(tmp_path, tag) == scalars(full_dir, tag), tag
    assert not any(line.startswith("stopping at iteration") for line in log_lines(tmp_path))


def test_a_stop_at_the_last_step_with_no_evaluation_owed_saves_and_exits_0(tmp_path, monkeypatch):
    """With no validation and no test split, the requeue it asked for (exit 75) only started a job
    that found the run finished and said `nothing to do`."""
    none = ("trainer.limit_val_batches=0", "trainer.limit_test_batches=0")
    code, losses = run_recording(monkeypatch, tiny_config(tmp_path, *MOCK, *none), signal_at=6)
    assert code == 0 and sorted(losses) == [1, 2, 3, 4, 5, 6]
    assert complete_steps(tmp_path / "checkpoints")[-1] == 6
    assert not any(line.startswith("stopping at iteration") for line in log_lines(tmp_path))


def test_the_validation_a_resumed_run_ran_before_a_stop_in_the_test_split_is_not_run_again(
    uninterrupted, tmp_path, monkeypatch
):
    """The resumed run at max_steps validated, then stopped inside the test split: its exit kept the
    checkpoint it loaded, whose state still owed the validation, so the next run validated again
    (the loss logged twice at iteration 6) while the stop line said it only evaluates the test split."""
    full_dir, _ = uninterrupted
    assert run_recording(monkeypatch, config(tmp_path), signal_at=6)[0] == EXIT_REQUEUE
    signal_inside_evaluation(monkeypatch, TB_TEST_LOSS, at_step=6)
    assert run_recording(monkeypatch, config(tmp_path)) == (EXIT_REQUEUE, {})
    monkeypatch.undo()
    assert log_lines(tmp_path)[-1] == f"{END_LEFT} the test split; exit 75 to be requeued"
    assert run_recording(monkeypatch, config(tmp_path)) == (0, {})
    assert (
        "iteration 6 is already at trainer.max_steps=6: evaluating the test split, which the run stopped before"
    ) in log_lines(tmp_path)
    assert_the_end_as_uninterrupted(tmp_path, full_dir)


def test_a_stop_after_the_validation_a_resume_ran_first_does_not_leave_it_owed(
    uninterrupted, tmp_path, monkeypatch
):
    """Resumed at iteration 3 (its stop came before the validation), the run validated, then a stop
    agreed before the first step exited 75 with nothing saved: the checkpoint still owed the
    validation, and the next run validated iteration 3 a second time."""
    import os
    import signal

    from gptrain.train import saving

    full_dir, _ = uninterrupted
    assert run_recording(monkeypatch, config(tmp_path), signal_at=3)[0] == EXIT_REQUEUE
    real_record = saving.record_left_due_validation

    def recorded_then_signalled(s):
        real_record(s)
        os.kill(os.getpid(), signal.SIGUSR1)

    monkeypatch.setattr(saving, "record_left_due_validation", recorded_then_signalled)
    assert run_recording(monkeypatch, config(tmp_path)) == (EXIT_REQUEUE, {})
    monkeypatch.undo()
    code, trained = run_recording(monkeypatch, config(tmp_path))
    assert code == 0 and sorted(trained) == [4, 5, 6]
    assert evaluation_lines(tmp_path) == evaluation_lines(full_dir)  # iteration 3's once
    assert scalars(tmp_path, TB_VAL_LOSS) == scalars(full_dir, TB_VAL_LOSS)


def test_a_validation_its_checkpoint_could_not_record_is_named_left_in_the_stop_line(tmp_path, monkeypatch):
    """The stop line said 'only evaluates the test split' from this run's memory, while the resume,
    reading the checkpoint, validated again: it now says what the checkpoint records."""
    from gptrain.checkpoint.manager import CheckpointManager

    assert run_recording(monkeypatch, config(tmp_path), signal_at=6)[0] == EXIT_REQUEUE

    def unwritable(self, step, metrics):
        raise OSError(30, "Read-only file system")

    monkeypatch.setattr(CheckpointManager, "record_metrics_of_resumed", unwritable)
    signal_inside_evaluation(monkeypatch, TB_TEST_LOSS, at_step=6)
    assert run_recording(monkeypatch, config(tmp_path)) == (EXIT_REQUEUE, {})
    monkeypatch.undo()
    left = f"{END_LEFT} its validation and the test split; exit 75 to be requeued"
    assert log_lines(tmp_path)[-1] == left


def test_with_checkpoints_off_a_stop_inside_a_mid_run_validation_lets_it_finish(
    uninterrupted, tmp_path, monkeypatch
):
    """As at max_steps: nothing is saved or requeued with checkpoints off, so giving iteration 3's
    validation up only lost its result (review J); the run still stops, after it."""
    full_dir, _ = uninterrupted
    signal_inside_evaluation(monkeypatch, TB_VAL_LOSS, at_step=3)
    code, losses = run_recording(
        monkeypatch, config(tmp_path, "exp_manager.create_checkpoint_callback=false")
    )
    monkeypatch.undo()
    assert code == 0 and max(losses) == 3
    at_3 = [line for line in evaluation_lines(full_dir) if "iteration 3 " in line]
    assert at_3 and [line for line in evaluation_lines(tmp_path) if "iteration 3 " in line] == at_3


@pytest.mark.parametrize("stopped_at", [3, 6])
def test_a_start_up_longer_than_max_time_still_runs_the_owed_evaluations(tmp_path, monkeypatch, stopped_at):
    """trainer.max_time is a budget of steps: a resumed run whose start-up outlasts it still trains a
    step (StopRequest.signalled). The evaluations a stop left owed, run before the first step, stopped
    for max_time at their first batch, so every requeue exited 75 with nothing done (review J)."""
    import time

    from gptrain.train import resuming

    if stopped_at == 3:
        signal_inside_evaluation(monkeypatch, TB_VAL_LOSS, at_step=3)
        code, _ = run_recording(monkeypatch, config(tmp_path))
    else:
        code, _ = run_recording(monkeypatch, config(tmp_path), signal_at=6)
    monkeypatch.undo()
    assert code == EXIT_REQUEUE
    real = resuming.resume

    def slow_start(*args, **kwargs):
        time.sleep(1.5)
        return real(*args, **kwargs)

    monkeypatch.setattr(resuming, "resume", slow_start)
    code, losses = run_recording(monkeypatch, config(tmp_path, "trainer.max_time=00:00:00:01"))
    assert [line for line in evaluation_lines(tmp_path) if f"iteration {stopped_at} " in line]
    if stopped_at == 3:  # the validation, then a step, then the stop max_time asks for
        assert code == EXIT_REQUEUE and sorted(losses) == [4]
    else:  # at max_steps: the validation and the test split, then done
        assert code == 0 and (tmp_path / TEST_DONE).read_text() == "6\n"


def test_the_stop_line_leaves_no_validation_to_a_run_without_validation_data(tmp_path, monkeypatch):
    """limit_val_batches > 0 but no validation data: the stop line said the resumed run evaluates
    `its validation and the test split`, and that run evaluated the test split only (review J)."""
    from gptrain.train import loop

    real = loop.b.build_datasets
    monkeypatch.setattr(
        loop.b, "build_datasets", lambda *a, **k: (lambda t: (t[0], None, t[2]))(real(*a, **k))
    )
    code, _ = run_recording(monkeypatch, config(tmp_path), signal_at=6)
    assert code == EXIT_REQUEUE
    assert log_lines(tmp_path)[-1] == f"{END_LEFT} the test split; exit 75 to be requeued"
