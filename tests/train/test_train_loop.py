"""End-to-end training on a tiny GPT (CPU, fp32, dropout on): resume, stop, results layout."""

import math
import shutil
from pathlib import Path

import pytest
import torch
import yaml
from train_e2e_helpers import (
    MOCK,
    TINY,
    Preempted,
    log_lines,
    preempted_at_the_test_split,
    run_recording,
    tiny_config,
)

from gptrain.checkpoint.integrity import complete_steps
from gptrain.errors import EXIT_REQUEUE, ConfigError
from gptrain.train import builders, eval_splits, loop, results, resuming, saving, step_loop
from gptrain.train.results import TB_TEST_LOSS, TEST_DONE
from gptrain.train.step import StepOptions, masked_lm_loss

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")


def use_loss_fn(monkeypatch: pytest.MonkeyPatch, loss_fn) -> None:
    """Trains with `loss_fn` (model, batch) -> loss in place of the run's own: how these tests make a
    step's loss or gradients non-finite."""
    real = builders.build_step_options
    monkeypatch.setattr(
        builders,
        "build_step_options",
        lambda cfg, dp: StepOptions(**{**vars(real(cfg, dp)), "loss_fn": loss_fn}),
    )


def final_weights(log_dir, step):
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    target = log_dir / f"weights_{step}.pt"
    dcp_to_torch_save(log_dir / "checkpoints" / f"step_{step}", target)
    return torch.load(target, weights_only=False)["model"]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    """One full 6-step run shared by the tests below."""
    log_dir = tmp_path_factory.mktemp("full")
    with pytest.MonkeyPatch.context() as mp:
        code, losses = run_recording(mp, tiny_config(log_dir, *MOCK))
    return log_dir, code, losses


def test_full_run_exits_zero_with_final_checkpoint(uninterrupted):
    log_dir, code, losses = uninterrupted
    assert code == 0 and sorted(losses) == [1, 2, 3, 4, 5, 6]
    assert all(math.isfinite(v) for v in losses.values())
    assert complete_steps(log_dir / "checkpoints") == [4, 6]  # save_top_k=2
    assert (log_dir / "checkpoints" / "latest").read_text().strip() == "step_6"
    saved = [line for line in log_lines(log_dir) if line.startswith("saved checkpoint step_6 ")]
    assert saved and saved[0].endswith("; removed step_2 (not among the 2 newest)")


@pytest.mark.parametrize("async_save", ["false", "true"])
def test_resume_after_sigusr1_is_bit_exact(uninterrupted, tmp_path, monkeypatch, async_save):
    full_dir, _, full_losses = uninterrupted
    async_saving = f"exp_manager.checkpoint_callback_params.async_save={async_save}"
    code, first = run_recording(monkeypatch, tiny_config(tmp_path, *MOCK, async_saving), signal_at=3)
    assert code == EXIT_REQUEUE and sorted(first) == [1, 2, 3]
    assert complete_steps(tmp_path / "checkpoints")[-1] == 3
    started, _ = saves_logged(tmp_path)  # the save before the stop is written in place on CPU
    assert started == (["step_2"] if async_save == "true" else [])
    code, second = run_recording(monkeypatch, tiny_config(tmp_path, *MOCK, async_saving))
    assert code == 0 and sorted(second) == [4, 5, 6]
    for step in range(1, 7):
        assert (first | second)[step] == full_losses[step], step  # bit for bit, not approx
    lines = log_lines(tmp_path)
    assert any(line.startswith("resuming from ") and "step_3 at iteration 3" in line for line in lines)
    assert run_recording(monkeypatch, tiny_config(tmp_path, *MOCK)) == (0, {})  # already done: no-op
    assert "already at trainer.max_steps=6: nothing to do" in log_lines(tmp_path)[-1]
    resumed, full = final_weights(tmp_path, 6), final_weights(full_dir, 6)
    assert resumed.keys() == full.keys()
    assert all(torch.equal(resumed[k], full[k]) for k in full)


def test_a_caller_gets_its_stop_handlers_back_after_a_requeue_stop(tmp_path, monkeypatch):
    """train() called in-process (a notebook, a test): after a stop for a requeue, SIGTERM and SIGUSR1
    stayed ignored for the rest of the caller's life, which was meant for a rank's shutdown only."""
    import signal

    def caller_handler(signum, frame):
        del signum, frame

    previous = {signum: signal.signal(signum, caller_handler) for signum in (signal.SIGTERM, signal.SIGUSR1)}
    try:
        code, _ = run_recording(monkeypatch, tiny_config(tmp_path, *MOCK), signal_at=1)
        after = {signum: signal.getsignal(signum) for signum in previous}
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    assert code == EXIT_REQUEUE
    assert after == {signal.SIGTERM: caller_handler, signal.SIGUSR1: caller_handler}


def test_a_caller_gets_its_stop_handlers_back_when_closing_the_run_log_fails(tmp_path, monkeypatch):
    """The handlers were given back after the run's closes: one that raised (the log's file system
    full at its last write) left SIGTERM and SIGUSR1 ignored for the rest of the caller's life."""
    import signal

    def caller_handler(signum, frame):
        del signum, frame

    def failing_close(self):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(loop.RunLog, "close", failing_close)
    previous = {signum: signal.signal(signum, caller_handler) for signum in (signal.SIGTERM, signal.SIGUSR1)}
    try:
        with pytest.raises(OSError, match="No space left on device"):
            run_recording(monkeypatch, tiny_config(tmp_path, *MOCK), signal_at=1)
        after = {signum: signal.getsignal(signum) for signum in previous}
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    assert after == {signal.SIGTERM: caller_handler, signal.SIGUSR1: caller_handler}


def test_exit_interval_saves_exits_zero_and_the_resume_is_bit_exact(uninterrupted, tmp_path, monkeypatch):
    """trainer.exit_interval (Megatron's --exit-interval): at iteration 5, not a save step, the run
    saves and exits 0 without validating; the same command then trains on to max_steps, step 6's loss
    and the final weights bit for bit the uninterrupted run's (the schedule still runs to max_steps)."""
    full_dir, _, full_losses = uninterrupted
    cfg = tiny_config(tmp_path, *MOCK, "trainer.exit_interval=5")
    code, first = run_recording(monkeypatch, cfg)
    assert code == 0 and sorted(first) == [1, 2, 3, 4, 5]
    assert complete_steps(tmp_path / "checkpoints") == [4, 5]
    lines = log_lines(tmp_path)
    assert lines[-1] == (
        "exiting at iteration 5: trainer.exit_interval=5; the same command resumes from its checkpoint; exit 0"
    )
    assert sum("validation loss" in line for line in lines) == 1  # at iteration 3 only
    code, second = run_recording(monkeypatch, tiny_config(tmp_path, *MOCK, "trainer.exit_interval=5"))
    assert code == 0 and sorted(second) == [6]
    for step in range(1, 7):
        assert (first | second)[step] == full_losses[step], step  # bit for bit, not approx
    resumed, full = final_weights(tmp_path, 6), final_weights(full_dir, 6)
    assert all(torch.equal(resumed[k], full[k]) for k in full)


def test_status_reads_the_exit_interval_stop_past_the_memory_report_a_gpu_prints(tmp_path, monkeypatch):
    """On CUDA the training prints Megatron's memory report after its exit line ('(after 5 iterations)
    memory (MB)'), and status took that line for the last training line: a run stopped at
    trainer.exit_interval was a bare COMPLETED. Here log_memory prints as it does on a GPU."""
    from gptrain.launch import record_state

    monkeypatch.setattr(builders, "log_memory", lambda log, device, step: log(
        f"[Rank 0] (after {step} iterations) memory (MB) | allocated: 1.0 | max allocated: 2.0 | reserved: 3.0"
        " | max reserved: 4.0"))  # fmt: skip
    code, _ = run_recording(monkeypatch, tiny_config(tmp_path, *MOCK, "trainer.exit_interval=5"))
    assert code == 0 and log_lines(tmp_path)[-1].startswith("[Rank 0] (after 5 iterations) memory (MB) |")
    log = str(tmp_path / "nemo_log_globalrank-0_localrank-0.txt")
    record = {"event": "submitted", "stage": "training", "executor": "local", "job_id": "local-1", "log": log}
    ended = {"event": "finished", "job_id": "local-1", "exit_code": code}
    assert record_state.job_state(record, [record, ended]).describe() == (
        "COMPLETED (stopped at its exit interval at iteration 5, not finished; launch the same command again"
        " to continue from its checkpoint)"
    )


def test_a_stop_at_the_exit_intervals_own_step_ends_the_run_there_with_exit_0(tmp_path, monkeypatch):
    """A stop signal agreed at iteration 5, trainer.exit_interval's own step, saved and exited 75: the
    batch script requeued the job, which trained on to the next exit interval (here max_steps) that the
    user had asked the run to stop before. The run ends where the exit interval ends it, exit 0."""
    from gptrain.launch.log_endings import EXITED_AT_INTERVAL

    cfg = tiny_config(tmp_path, *MOCK, "trainer.exit_interval=5")
    code, first = run_recording(monkeypatch, cfg, signal_at=5)
    assert code == 0 and sorted(first) == [1, 2, 3, 4, 5]
    assert complete_steps(tmp_path / "checkpoints") == [4, 5]
    last = log_lines(tmp_path)[-1]
    assert last == (
        "exiting at iteration 5: trainer.exit_interval=5; the same command resumes from its checkpoint; "
        "received SIGUSR1 at this iteration too; exit 0"
    )
    assert EXITED_AT_INTERVAL.search(last)["saved"]  # gptrain status: launch again to continue
    code, second = run_recording(monkeypatch, tiny_config(tmp_path, *MOCK, "trainer.exit_interval=5"))
    assert code == 0 and sorted(second) == [6]


def test_a_stop_before_the_exit_intervals_step_still_exits_75_to_be_requeued(tmp_path, monkeypatch):
    """Only a stop at trainer.exit_interval's own step ends the run with exit 0: a signal at iteration 3,
    before the interval's 5, exits 75 so that the batch script requeues the job, which trains on to 5."""
    cfg = tiny_config(tmp_path, *MOCK, "trainer.exit_interval=5")
    code, first = run_recording(monkeypatch, cfg, signal_at=3)
    assert code == EXIT_REQUEUE and sorted(first) == [1, 2, 3]
    assert complete_steps(tmp_path / "checkpoints")[-1] == 3
    last = log_lines(tmp_path)[-1]
    assert last.startswith("stopping at iteration 3: received SIGUSR1") and last.endswith(
        "; exit 75 to be requeued"
    )
    code, second = run_recording(monkeypatch, tiny_config(tmp_path, *MOCK, "trainer.exit_interval=5"))
    assert code == 0 and sorted(second) == [4, 5]
    assert log_lines(tmp_path)[-1].startswith("exiting at iteration 5: trainer.exit_interval=5;")


@pytest.mark.parametrize("value", ["0", "-2"])
def test_an_exit_interval_below_one_is_refused_naming_the_key(tmp_path, value):
    from gptrain.errors import ConfigError

    with pytest.raises(
        ConfigError, match=f"trainer.exit_interval: must be at least 1, or null .* got {value}"
    ):
        tiny_config(tmp_path, *MOCK, f"trainer.exit_interval={value}")


@pytest.mark.parametrize(("line_every", "timing_at"), [(3, [3, 6]), (2, [2, 4, 6])])
def test_tensorboard_log_interval_writes_every_nth_iterations_own_values(
    line_every, timing_at, tmp_path, monkeypatch
):
    """trainer.tensorboard_log_interval=2 with lines every 3 iterations, or every 2 (Megatron scripts
    often give both intervals the same N): the dashboards get iterations 2, 4 and 6, each with its own
    loss (the recorded one, as float32 keeps it) against its step and its consumed samples; the timing
    stays with the printed lines (not 1, the process's first line, whose time is its warm-up's:
    test_results_layout). Before, there was no such key: every point was a printed line's, the loss its
    mean over the interval; and later an interval equal to the line's still gave the line's points (at
    1, 2, 4, 6, each loss a mean), where Megatron writes iteration 2's, 4's and 6's own."""
    import numpy as np
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    overrides = [f"trainer.log_every_n_steps={line_every}", "trainer.tensorboard_log_interval=2"]
    code, losses = run_recording(monkeypatch, tiny_config(tmp_path, *MOCK, *overrides))
    assert code == 0
    events = EventAccumulator(str(tmp_path), size_guidance={"scalars": 0}).Reload()

    def series(tag):
        return [(e.step, e.value) for e in events.Scalars(tag)]

    own = [(step, float(np.float32(losses[step]))) for step in (2, 4, 6)]
    assert series("lm loss") == series("reduced_train_loss") == own
    assert series("lm loss vs samples") == [(4 * step, loss) for step, loss in own]  # global batch 4
    assert [step for step, _ in series("iteration-time")] == timing_at  # the first line's is its warm-up's
    assert [step for step, _ in series("learning-rate")] == [2, 4, 6]


def test_an_interval_the_fp16_scaler_skips_has_its_loss_in_tensorboard(tmp_path, monkeypatch):
    """trainer.precision=16 from the dynamic scaler's 2**32 overflows fp16 gradients on CPU: the first
    iterations are skipped. Their intervals wrote no loss point (the mean of no updated iteration),
    where Megatron writes every logged iteration's own loss, skipped or not. An interval with no
    update now gets the mean of its iterations' losses; one with an update keeps its updated mean."""
    import numpy as np
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    overrides = ["trainer.precision=16", "trainer.max_steps=4", "trainer.log_every_n_steps=2"]
    overrides += ["trainer.val_check_interval=4", "trainer.limit_test_batches=0"]
    code, losses = run_recording(monkeypatch, tiny_config(tmp_path, *MOCK, *overrides))
    assert code == 0
    lines = [line for line in log_lines(tmp_path) if "number of skipped iterations" in line]
    skipped = [line.split("number of skipped iterations:")[1].split("|")[0].strip() for line in lines]
    # lines at 1, 2 and 4: every iteration skipped; the first line is a peek, as Megatron's: the line at 2
    # counts iterations 1 and 2 (test_the_first_line_of_a_process_does_not_end_its_loss_interval_as_megatrons)
    assert skipped == ["1", "2", "2"]
    assert all(math.isfinite(loss) for loss in losses.values())  # the gradients overflowed, not the loss
    events = EventAccumulator(str(tmp_path), size_guidance={"scalars": 0}).Reload()
    expected = [(1, losses[1]), (2, (losses[1] + losses[2]) / 2), (4, (losses[3] + losses[4]) / 2)]
    for tag in ("lm loss", "reduced_train_loss"):
        assert [(e.step, e.value) for e in events.Scalars(tag)] == [
            (step, float(np.float32(loss))) for step, loss in expected
        ], tag
    assert "grad norm" not in events.Tags()["scalars"]  # none for a skipped iteration, as in the line


@pytest.mark.parametrize("value", ["0", "-1"])
def test_a_tensorboard_log_interval_below_one_is_refused_naming_the_key(tmp_path, value):
    from gptrain.errors import ConfigError

    with pytest.raises(
        ConfigError, match=f"trainer.tensorboard_log_interval: must be at least 1, .* got {value}"
    ):
        tiny_config(tmp_path, *MOCK, f"trainer.tensorboard_log_interval={value}")


def signal_during(monkeypatch, owner, name: str, at_step: int) -> None:
    """SIGUSR1 to this process while `owner.name` runs at iteration `at_step` (as Slurm's warning
    signal lands in whatever the run is doing: a long save or validation most likely)."""
    import os
    import signal

    real = getattr(owner, name)

    def signalled(s, *args, **kwargs):
        if s.state.step == at_step:
            os.kill(os.getpid(), signal.SIGUSR1)
        return real(s, *args, **kwargs)

    monkeypatch.setattr(owner, name, signalled)


@pytest.mark.parametrize("async_save", ["false", "true"])
def test_a_stop_asked_during_a_save_exits_after_that_save(uninterrupted, tmp_path, monkeypatch, async_save):
    """The stop was seen only at the next step's end: the run trained one more step and saved again
    in the time Slurm's warning signal leaves before the kill (for a large model, a second save of
    minutes). Now it exits 75 once the save it was in is written, and resumes from it bit-exactly."""
    full_dir, _, full_losses = uninterrupted
    async_saving = f"exp_manager.checkpoint_callback_params.async_save={async_save}"
    signal_during(monkeypatch, saving, "save_checkpoint", at_step=4)
    code, first = run_recording(monkeypatch, tiny_config(tmp_path, *MOCK, async_saving))
    monkeypatch.undo()
    assert code == EXIT_REQUEUE and sorted(first) == [1, 2, 3, 4]
    assert complete_steps(tmp_path / "checkpoints") == [2, 4]
    assert "stopping at iteration 4: received SIGUSR1" in log_lines(tmp_path)[-1]
    code, second = run_recording(monkeypatch, tiny_config(tmp_path, *MOCK, async_saving))
    assert code == 0 and sorted(second) == [5, 6]
    for step in range(1, 7):
        assert (first | second)[step] == full_losses[step], step
    resumed, full = final_weights(tmp_path, 6), final_weights(full_dir, 6)
    assert all(torch.equal(resumed[k], full[k]) for k in full)


def test_a_stop_asked_during_a_validation_saves_at_that_step(uninterrupted, tmp_path, monkeypatch):
    """Validation at iteration 3 (val_check_interval=3; no save due there): the stop saves at 3 instead
    of after one more step. Asked as the validation starts, it is given up before its first batch
    (test_stop_in_evaluation.py: inside one), and the resumed run runs it first."""
    full_dir, _, full_losses = uninterrupted
    signal_during(monkeypatch, eval_splits, "validate", at_step=3)
    code, first = run_recording(monkeypatch, tiny_config(tmp_path, *MOCK))
    monkeypatch.undo()
    assert code == EXIT_REQUEUE and sorted(first) == [1, 2, 3]
    assert complete_steps(tmp_path / "checkpoints")[-1] == 3
    assert "its validation runs first" in log_lines(tmp_path)[-1] and validation_lines(tmp_path) == []
    code, second = run_recording(monkeypatch, tiny_config(tmp_path, *MOCK))
    assert code == 0 and sorted(second) == [4, 5, 6]
    assert "validation of iteration 3 was due when the run stopped: running it first" in log_lines(tmp_path)
    assert validation_lines(tmp_path) == validation_lines(full_dir)  # 3 and 6, each once
    for step in range(1, 7):
        assert (first | second)[step] == full_losses[step], step


def validation_lines(log_dir: Path) -> list[str]:
    return [line for line in log_lines(log_dir) if "validation loss at iteration" in line]


def test_a_stop_on_a_validation_step_leaves_that_validation_to_the_resumed_run(
    uninterrupted, tmp_path, monkeypatch
):
    """A stop saves at once, before the validation due at the same step; the resumed run used to start
    one step later, so the curve lost that point for good."""
    full_dir, _, _ = uninterrupted
    code, _ = run_recording(monkeypatch, tiny_config(tmp_path, *MOCK), signal_at=3)  # val_check_interval=3
    assert code == EXIT_REQUEUE
    assert validation_lines(tmp_path) == []
    assert "its validation runs first when the run resumes" in log_lines(tmp_path)[-1]
    code, _ = run_recording(monkeypatch, tiny_config(tmp_path, *MOCK))
    assert code == 0
    assert "validation of iteration 3 was due when the run stopped: running it first" in log_lines(tmp_path)
    assert validation_lines(tmp_path) == validation_lines(full_dir)  # iterations 3 and 6, same losses


def test_a_stop_during_the_validation_a_resume_runs_first_exits_before_a_step(
    uninterrupted, tmp_path, monkeypatch
):
    """The resumed run validates iteration 3 first (its stop came before that validation); Slurm's
    warning signal landing in that validation was agreed only at the end of step 4, which the run
    trained and saved in the time left before the kill. Now it exits 75 at once, nothing trained or
    saved: the requeued run validates iteration 3 again and goes on."""
    code, _ = run_recording(monkeypatch, tiny_config(tmp_path, *MOCK), signal_at=3)  # val_check_interval=3
    assert code == EXIT_REQUEUE and complete_steps(tmp_path / "checkpoints")[-1] == 3
    signal_during(monkeypatch, eval_splits, "validate", at_step=3)
    code, trained = run_recording(monkeypatch, tiny_config(tmp_path, *MOCK))
    monkeypatch.undo()
    assert code == EXIT_REQUEUE and trained == {}
    assert complete_steps(tmp_path / "checkpoints")[-1] == 3
    assert "stopping before the first step: received SIGUSR1" in log_lines(tmp_path)[-1]
    code, trained = run_recording(monkeypatch, tiny_config(tmp_path, *MOCK))
    assert code == 0 and sorted(trained) == [4, 5, 6]
    assert validation_lines(tmp_path)[-1] == validation_lines(uninterrupted[0])[-1]  # iteration 6
    for step in trained:
        assert trained[step] == uninterrupted[2][step], step


def test_a_stop_during_start_up_exits_before_the_validation_a_resume_owes(
    uninterrupted, tmp_path, monkeypatch
):
    """Slurm's warning signal landing in the checkpoint load of a resume that owes a validation: the
    run ran that whole validation (minutes, at scale, past the signal's grace time) before exiting
    75, and the requeued run ran it again (two points for iteration 3). Now it exits before it."""
    import os
    import signal

    code, _ = run_recording(monkeypatch, tiny_config(tmp_path, *MOCK), signal_at=3)  # val_check_interval=3
    assert code == EXIT_REQUEUE and validation_lines(tmp_path) == []
    real_resume = resuming.resume

    def signalled_while_loading(s, *args, **kwargs):
        os.kill(os.getpid(), signal.SIGUSR1)
        return real_resume(s, *args, **kwargs)

    monkeypatch.setattr(resuming, "resume", signalled_while_loading)
    code, trained = run_recording(monkeypatch, tiny_config(tmp_path, *MOCK))
    monkeypatch.undo()
    assert code == EXIT_REQUEUE and trained == {} and validation_lines(tmp_path) == []
    code, trained = run_recording(monkeypatch, tiny_config(tmp_path, *MOCK))
    assert code == 0 and sorted(trained) == [4, 5, 6]
    assert validation_lines(tmp_path) == validation_lines(uninterrupted[0])  # each iteration's once


def test_a_run_stopped_before_its_test_split_evaluates_it_when_resumed(uninterrupted, tmp_path, monkeypatch):
    """The run saved step_6 (max_steps) and ended before its test split ran: resuming at max_steps said
    'nothing to do', and the test split was never evaluated. Now the resume evaluates it, without
    training, to the uninterrupted run's loss; a second resume has nothing to do."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    full_dir, _, _ = uninterrupted
    preempted_at_the_test_split(monkeypatch)
    with pytest.raises(Preempted):
        run_recording(monkeypatch, tiny_config(tmp_path, *MOCK))
    monkeypatch.undo()
    assert complete_steps(tmp_path / "checkpoints")[-1] == 6
    assert lines_on_test_set(tmp_path) == [] and lines_on_test_set(full_dir) != []
    assert run_recording(monkeypatch, tiny_config(tmp_path, *MOCK)) == (0, {})  # nothing trained
    assert (
        "iteration 6 is already at trainer.max_steps=6: evaluating the test split, which the run stopped before"
        in log_lines(tmp_path)
    )
    assert lines_on_test_set(tmp_path) == lines_on_test_set(full_dir)  # the same loss, bit for bit
    test_losses = EventAccumulator(str(tmp_path)).Reload().Scalars(TB_TEST_LOSS)
    assert [(e.step, e.value) for e in test_losses] == [
        (e.step, e.value) for e in EventAccumulator(str(full_dir)).Reload().Scalars(TB_TEST_LOSS)
    ]
    assert run_recording(monkeypatch, tiny_config(tmp_path, *MOCK)) == (0, {})
    assert "already at trainer.max_steps=6: nothing to do" in log_lines(tmp_path)[-1]
    assert len(lines_on_test_set(tmp_path)) == 1
    assert not list(tmp_path.glob(".*.tmp"))  # the record of the test split done was written whole
    (tmp_path / TEST_DONE).write_text("4\n")  # tested at an earlier max_steps, stopped before this one's
    assert run_recording(monkeypatch, tiny_config(tmp_path, *MOCK)) == (0, {})
    assert len(lines_on_test_set(tmp_path)) == 2 and (tmp_path / TEST_DONE).read_text() == "6\n"


def lines_on_test_set(log_dir: Path) -> list[str]:
    return [line for line in log_lines(log_dir) if " on test set |" in line]


class ShiftedClock:
    """time as the meter reads it, moved on by `offset` seconds (a validation's time, without waiting)."""

    def __init__(self) -> None:
        import time

        self.offset = 0.0
        self._perf_counter = time.perf_counter

    def perf_counter(self) -> float:
        return self._perf_counter() + self.offset


def test_the_validation_a_resumed_run_runs_first_is_not_training_time(tmp_path, monkeypatch):
    """The validation left due at a stop ran inside the resumed run's first interval, so that iteration
    line's time per iteration, TFLOP/s and TensorBoard's step timing took in the whole validation; it is
    left out, as every other validation is (Megatron stops its interval timer around evaluation)."""
    import re

    from gptrain.train import meter

    code, _ = run_recording(monkeypatch, tiny_config(tmp_path, *MOCK), signal_at=3)  # val_check_interval=3
    assert code == EXIT_REQUEUE
    clock = ShiftedClock()
    monkeypatch.setattr(meter, "time", clock)
    real_evaluate = eval_splits.evaluate

    def evaluate_taking_1000_s(*args):
        clock.offset += 1000.0
        return real_evaluate(*args)

    monkeypatch.setattr(eval_splits, "evaluate", evaluate_taking_1000_s)
    code, _ = run_recording(monkeypatch, tiny_config(tmp_path, *MOCK))
    assert code == 0
    assert "validation of iteration 3 was due when the run stopped: running it first" in log_lines(tmp_path)
    elapsed_ms = [
        float(m.group(1))
        for line in log_lines(tmp_path)
        if (m := re.search(r"iteration +[4-6]/ +6 \|.*elapsed time per iteration \(ms\): ([0-9.]+)", line))
    ]
    assert len(elapsed_ms) == 3 and max(elapsed_ms) < 1000 * 1000.0


def test_a_resume_from_a_save_after_its_validation_does_not_validate_again(tmp_path, monkeypatch):
    """Validation comes before the save of the same step, so that checkpoint records it done."""
    every_3 = "exp_manager.checkpoint_callback_params.every_n_train_steps=3"
    code, _ = run_recording(monkeypatch, tiny_config(tmp_path, *MOCK, every_3))
    assert code == 0 and complete_steps(tmp_path / "checkpoints") == [3, 6]
    shutil.rmtree(tmp_path / "checkpoints" / "step_6")  # the resume takes step_3, saved in the loop
    code, losses = run_recording(monkeypatch, tiny_config(tmp_path, *MOCK, every_3))
    assert code == 0 and sorted(losses) == [4, 5, 6]
    lines = log_lines(tmp_path)
    resumed = lines[max(i for i, line in enumerate(lines) if line.startswith("resuming from ")) :]
    validated = [line.split("|")[0].strip() for line in resumed if "validation loss at iteration" in line]
    assert validated == [
        "validation loss at iteration 6",
        "validation loss at iteration 6 on validation set",
        "validation loss at iteration 6 on test set",
    ]


def test_a_finished_run_extended_does_not_validate_its_last_step_again(tmp_path, monkeypatch):
    """The end's validation comes before the last save too, so that save records it done."""
    code, _ = run_recording(monkeypatch, tiny_config(tmp_path, *MOCK, "trainer.max_steps=3"))
    assert code == 0 and complete_steps(tmp_path / "checkpoints")[-1] == 3
    code, losses = run_recording(monkeypatch, tiny_config(tmp_path, *MOCK))
    assert code == 0 and sorted(losses) == [4, 5, 6]
    validated = [line.split("|")[0].strip() for line in validation_lines(tmp_path) if "test set" not in line]
    assert validated == [
        "validation loss at iteration 3",
        "validation loss at iteration 3 on validation set",  # the first run's end
        "validation loss at iteration 6",
        "validation loss at iteration 6 on validation set",
    ]


def test_a_checkpoint_from_before_validated_at_resumes_and_validates_its_step(
    uninterrupted, tmp_path, monkeypatch
):
    """Checkpoints saved before TrainState recorded `validated_at` lack that key; they load, and the
    step's validation (unknown to them) runs again."""
    from gptrain.checkpoint.compat import read_metadata
    from gptrain.train.state import TrainState

    full_dir, _, _ = uninterrupted
    real = TrainState.state_dict
    with monkeypatch.context() as old:
        old.setattr(
            TrainState,
            "state_dict",
            lambda self: {k: v for k, v in real(self).items() if k != "validated_at"},
        )
        code, _ = run_recording(monkeypatch, tiny_config(tmp_path, *MOCK), signal_at=3)
    assert code == EXIT_REQUEUE
    keys = read_metadata(tmp_path / "checkpoints" / "step_3").state_dict_metadata
    assert "train.step" in keys and "train.validated_at" not in keys
    code, losses = run_recording(monkeypatch, tiny_config(tmp_path, *MOCK))
    assert code == 0 and sorted(losses) == [4, 5, 6]
    assert validation_lines(tmp_path) == validation_lines(full_dir)


ASYNC = "exp_manager.checkpoint_callback_params.async_save=true"
NO_EVALUATION = ["trainer.limit_val_batches=0", "trainer.limit_test_batches=0"]


def saves_logged(log_dir: Path) -> tuple[list[str], dict[str, str]]:
    """(the steps logged as saved in the background, {step_N: its "saved checkpoint" line})."""
    lines = log_lines(log_dir)
    started = [line.split()[2] for line in lines if line.startswith("saving checkpoint")]
    return started, {line.split()[2]: line for line in lines if line.startswith("saved checkpoint")}


def test_an_async_run_with_nothing_after_its_last_save_writes_it_in_place(tmp_path, monkeypatch):
    """Saves 2 and 4 go to the background; the last (6), which the run waits for at once (no
    evaluation follows), is written in place: the same run, and weights, as with synchronous saves."""
    code, sync_losses = run_recording(monkeypatch, tiny_config(tmp_path / "sync", *MOCK, *NO_EVALUATION))
    assert code == 0
    code, losses = run_recording(monkeypatch, tiny_config(tmp_path / "async", *MOCK, *NO_EVALUATION, ASYNC))
    assert code == 0 and losses == sync_losses
    started, saved = saves_logged(tmp_path / "async")
    assert started == ["step_2", "step_4"] and list(saved) == ["step_2", "step_4", "step_6"]
    assert all("written in the background" in saved[name] for name in started)
    assert "training stalled" in saved["step_6"] and "background" not in saved["step_6"]
    in_place, synchronous = final_weights(tmp_path / "async", 6), final_weights(tmp_path / "sync", 6)
    assert all(torch.equal(in_place[k], synchronous[k]) for k in synchronous)


def test_the_test_split_is_evaluated_beside_the_last_background_write(tmp_path, monkeypatch):
    """With validation and a test split after it, the last save goes to the background too, and
    the run waits for it only after the test split."""
    pending_at_test = []
    real_evaluate_split = eval_splits.evaluate_split

    def recording(s, data, batches, where, tag, *stop_check):
        if tag == results.TB_TEST_LOSS:
            pending_at_test.append(s.checkpoints.writing)
        real_evaluate_split(s, data, batches, where, tag, *stop_check)

    monkeypatch.setattr(eval_splits, "evaluate_split", recording)
    code, _ = run_recording(monkeypatch, tiny_config(tmp_path, *MOCK, ASYNC))
    assert code == 0 and pending_at_test == [True]
    assert any("on test set" in line for line in log_lines(tmp_path))
    started, saved = saves_logged(tmp_path)
    assert started == ["step_2", "step_4", "step_6"] and "written in the background" in saved["step_6"]
    assert complete_steps(tmp_path / "checkpoints") == [4, 6]


@pytest.mark.parametrize("lead", [None, "300"])
def test_a_save_longer_than_the_signal_lead_is_warned_of_once(tmp_path, monkeypatch, lead):
    """Under the batch script (GPTRAIN_SIGNAL_SECONDS, cluster.signal_seconds), a save longer than the
    warning signal's lead means a stop at the time limit is killed mid-save: said once, at the first."""
    taken = {2: 12.0, 4: 400.2, 6: 500.0}  # seconds each save's write is said to take
    real_report_save = saving.report_save

    def slow_report_save(s, report):
        report.write_s = taken[report.step]
        real_report_save(s, report)

    monkeypatch.setattr(saving, "report_save", slow_report_save)
    if lead is None:
        monkeypatch.delenv("GPTRAIN_SIGNAL_SECONDS", raising=False)
    else:
        monkeypatch.setenv("GPTRAIN_SIGNAL_SECONDS", lead)
    code, _ = run_recording(monkeypatch, tiny_config(tmp_path, *MOCK, *NO_EVALUATION))
    assert code == 0
    warnings = [line for line in log_lines(tmp_path) if "warning signal comes before" in line]
    if lead is None:
        assert warnings == []
        return
    assert warnings == [
        "warning: saving step_4 took 400 s, longer than the 300 s by which Slurm's warning signal comes before"
        " the time limit (cluster.signal_seconds): a stop there would be killed before its checkpoint is"
        " complete and the job not requeued; give cluster.signal_seconds=802 or more (twice this save)"
    ]


def test_running_out_of_training_samples_names_the_iteration_left_without_them():
    """Named by the batches drawn, not by the steps recorded: under trainer.run_ahead the batch of
    iteration 5 is drawn while iteration 4 is still queued (state.step 3 here)."""
    from types import SimpleNamespace

    from gptrain.errors import DataError

    model = SimpleNamespace(
        micro_batch_size=2, global_batch_size=4, seed=0, data=SimpleNamespace(num_workers=0)
    )
    s = SimpleNamespace(
        cfg=SimpleNamespace(model=model, trainer=SimpleNamespace(max_steps=5)),
        state=SimpleNamespace(step=3, consumed_samples=4),
        dp_rank=0,
        dp_size=1,
        device=torch.device("cpu"),
        current_global_batch=lambda: 4,
    )
    batches = step_loop.microbatches(s, [{"tokens": torch.tensor([i])} for i in range(10)])
    assert [mb["tokens"].tolist() for mb in next(batches)] == [[[4], [5]], [[6], [7]]]
    with pytest.raises(DataError, match=r"^the train split ran out of samples at iteration 5 \(after 8 "):
        next(batches)


def test_results_layout(uninterrupted):
    log_dir, _, _ = uninterrupted
    hparams = yaml.safe_load((log_dir / "hparams.yaml").read_text())
    assert hparams["trainer"]["max_steps"] == 6 and hparams["exp_manager"]["explicit_log_dir"] == str(log_dir)
    assert (log_dir / "cmd-args.log").read_text().strip()
    git = (log_dir / "git-info.log").read_text()
    assert git.startswith("commit hash: ") or git.strip() == "not a git checkout"
    lines = log_lines(log_dir)
    assert lines[0].startswith("gptrain: ") and "parameters" in lines[0] and str(log_dir) in lines[0]
    assert "no complete checkpoint" in lines[1]
    # Megatron's start-of-run lines (issue 11): the padding, then one line per (TP, PP) rank
    assert " > padded vocab (size: 100) with 28 dummy tokens (new size: 128)" in lines
    assert any(
        line.startswith(" > number of parameters on (tensor, pipeline) model parallel rank (0, 0): ")
        for line in lines
    )
    iteration_lines = [line for line in lines if " iteration " in line and "consumed samples" in line]
    assert (
        len(iteration_lines) == 6
        and "iteration        6/       6 | consumed samples:           24 |" in iteration_lines[-1]
    )
    validation = [line for line in lines if line.startswith(" validation loss at iteration ")]
    assert [line.split(" | ")[0] for line in validation] == [
        " validation loss at iteration 3",
        " validation loss at iteration 6",  # on the interval
        " validation loss at iteration 6 on validation set",  # after training, from the same evaluation
        " validation loss at iteration 6 on test set",
    ]
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(log_dir)).Reload()
    tags = set(events.Tags()["scalars"])
    assert {
        "lm loss",
        "val loss",
        "learning rate",
        "grad norm",
        "loss scale",
        "train_step_timing in s",
    } <= tags
    assert {"tokens per second", "TFLOP/s/GPU"} <= tags
    # the process's first line is its first step alone, warm-up included (compilation: hundreds of times a
    # step): its loss goes to the dashboards, its timing not (as Megatron's iteration-time), or every
    # restart drew a spike that set the charts' scale
    assert [e.step for e in events.Scalars("lm loss")] == [1, 2, 3, 4, 5, 6]
    for tag in ("iteration-time", "train_step_timing in s", "TFLOP/s/GPU", "tokens per second", "throughput"):
        assert [e.step for e in events.Scalars(tag)] == [2, 3, 4, 5, 6], tag
    assert "consumed samples" in events.Tags()["tensors"]  # a count: float64, exact past 2**24
    assert [e.step for e in events.Scalars("val loss")] == [3, 6]


def test_each_skipped_non_finite_iteration_is_named_in_the_log(tmp_path, monkeypatch):
    """A lone NaN iteration was seen only as a count in the next iteration line (every
    log_every_n_steps): which iteration, and with what loss and grad norm, was not said anywhere, so a
    NaN weeks into a run could not be traced to its batch. Each one now has a warning line."""

    def nan_at_step_3(model, batch):
        loss = masked_lm_loss(model, batch)
        if not torch.is_grad_enabled():  # validation
            return loss
        calls.append(1)
        return loss * float("nan") if len(calls) in (5, 6) else loss  # 2 micro-batches a step

    calls: list[int] = []
    use_loss_fn(monkeypatch, nan_at_step_3)
    code, losses = run_recording(monkeypatch, tiny_config(tmp_path, *MOCK, "trainer.log_every_n_steps=5"))
    assert code == 0 and math.isnan(losses[3])
    warnings = [line for line in log_lines(tmp_path) if "not finite" in line]
    assert warnings == [
        "warning: iteration 3 skipped: loss or gradients not finite (lm loss nan); 1 in a row, "
        "trainer.max_consecutive_nonfinite=5 in a row stop the run"
    ]


def test_the_iterations_before_a_divergence_stop_are_logged(tmp_path, monkeypatch):
    """A run stopped by trainer.max_consecutive_nonfinite between two iteration lines left the losses of
    the iterations since the last line unwritten (the climb before the NaNs, in the log and TensorBoard),
    as a stop signal once did; they are logged before the stop's line."""
    import re

    def nan_from_step_4(model, batch):
        loss = masked_lm_loss(model, batch)
        if not torch.is_grad_enabled():  # validation
            return loss
        calls.append(1)
        return loss * float("nan") if len(calls) > 3 * 2 else loss  # 2 micro-batches a step

    calls: list[int] = []
    use_loss_fn(monkeypatch, nan_from_step_4)
    overrides = [
        "trainer.max_consecutive_nonfinite=2",
        "trainer.max_steps=20",
        "trainer.log_every_n_steps=10",
    ]
    with pytest.raises(step_loop.TrainingDivergedError):
        run_recording(monkeypatch, tiny_config(tmp_path, *MOCK, *overrides))
    lines = log_lines(tmp_path)
    logged = [int(m[1]) for line in lines if (m := re.search(r"iteration +(\d+)/ +20 \|", line))]
    assert logged == [1, 5]
    line = next(line for line in lines if re.search(r"iteration +5/", line))
    assert "number of nan iterations:   2" in line and "lm loss:" in line  # iterations 2 and 3's mean
    stop = next(i for i, text in enumerate(lines) if text.startswith("loss or gradients not finite for 2"))
    assert lines.index(line) < stop  # logged before the stop's own line


def test_the_values_of_each_non_finite_iteration_are_logged_up_to_the_stop(tmp_path, monkeypatch):
    """The iteration that reached trainer.max_consecutive_nonfinite had its loss and grad norm nowhere:
    only those below the limit got a warning, so with a limit of 1 (`gptrain megatron`'s, for Megatron's
    NaN check) no value was printed at all. The stop line names them; a finite loss whose gradients are
    infinite is told apart from a NaN loss by its grad norm, in the warning and the stop line alike."""
    import re

    def infinite_gradients_from_step_3(model, batch):
        loss = masked_lm_loss(model, batch)
        if not torch.is_grad_enabled():  # validation
            return loss
        calls.append(1)
        if len(calls) <= 2 * 2:  # 2 micro-batches a step
            return loss
        weight = next(model.parameters()) * 1.0
        weight.register_hook(lambda grad: torch.full_like(grad, float("inf")))
        return loss + (weight * 0.0).sum()

    calls: list[int] = []
    use_loss_fn(monkeypatch, infinite_gradients_from_step_3)
    cfg = tiny_config(tmp_path, *MOCK, "trainer.max_consecutive_nonfinite=2", "trainer.max_steps=20")
    with pytest.raises(step_loop.TrainingDivergedError) as info:
        run_recording(monkeypatch, cfg)
    finite = r"lm loss (\d+\.?\d*(e[-+]\d+)?), grad norm inf"  # %g of a finite loss
    warnings = [line for line in log_lines(tmp_path) if line.startswith("warning: iteration")]
    assert len(warnings) == 1
    assert re.fullmatch(
        rf"warning: iteration 3 skipped: loss or gradients not finite \({finite}\); 1 in a row, .*",
        warnings[0],
    )
    assert re.search(
        rf"2 iterations in a row \(last at iteration 4: {finite}\); last good checkpoint", str(info.value)
    )


def test_nan_iterations_are_skipped_counted_and_stop_the_run(tmp_path, monkeypatch):
    def nan_from_step_3(model, batch):
        loss = masked_lm_loss(model, batch)
        return loss * float("nan") if calls.append(1) or len(calls) > 2 * 2 else loss  # 2 microbatches/step

    calls: list[int] = []
    use_loss_fn(monkeypatch, nan_from_step_3)
    cfg = tiny_config(tmp_path, *MOCK, "trainer.max_consecutive_nonfinite=3", "trainer.max_steps=20")
    with pytest.raises(
        step_loop.TrainingDivergedError, match=r"3 iterations in a row \(last at iteration 5: lm loss nan\);"
    ) as info:
        run_recording(monkeypatch, cfg)
    assert f"last good checkpoint: {tmp_path / 'checkpoints' / 'step_2'};" in str(info.value)
    assert complete_steps(tmp_path / "checkpoints") == [2]  # no save during the streak
    lines = [line for line in log_lines(tmp_path) if "number of nan iterations" in line]
    counts = [line.split("number of nan iterations:")[1].split("|")[0].strip() for line in lines]
    assert counts == ["0", "0", "1", "1", "1"]
    # not updated, so skipped too: Megatron counts a nan iteration only among the skipped ones
    skipped = [line.split("number of skipped iterations:")[1].split("|")[0].strip() for line in lines]
    assert skipped == counts
    # Megatron prints the loss of an interval of skipped iterations as 0 (its sum over max(1, 0)), no grad norm
    assert " lm loss: 0.000000E+00 |" in lines[3] and "grad norm" not in lines[3]


def test_a_checkpoint_saved_inside_a_non_finite_streak_is_not_called_the_last_good_one(tmp_path, monkeypatch):
    """An exit interval's save is made inside a non-finite streak too: step_3, NaN from iteration 3,
    was named 'last good checkpoint' when the resumed run diverged. The stop line names step_2, the
    newest before the streak, and says that step_3, inside it, holds iteration 2's weights."""

    def nan_after(model, batch):
        loss = masked_lm_loss(model, batch)
        if not torch.is_grad_enabled():  # validation
            return loss
        calls.append(1)
        return loss * float("nan") if len(calls) > finite_calls[0] else loss

    calls: list[int] = []
    finite_calls = [2 * 2]  # 2 micro-batches a step: NaN from iteration 3
    use_loss_fn(monkeypatch, nan_after)
    overrides = ["trainer.max_consecutive_nonfinite=3", "trainer.exit_interval=3", "trainer.max_steps=20"]
    code, _ = run_recording(monkeypatch, tiny_config(tmp_path, *MOCK, *overrides))
    assert code == 0 and complete_steps(tmp_path / "checkpoints") == [2, 3]  # step_3 inside the streak
    finite_calls[0] = 0  # the resumed run: NaN from its first iteration, the 4th
    with pytest.raises(step_loop.TrainingDivergedError) as info:
        run_recording(monkeypatch, tiny_config(tmp_path, *MOCK, *overrides))
    assert "3 iterations in a row (last at iteration 5" in str(info.value)
    assert (
        f"; last good checkpoint: {tmp_path / 'checkpoints' / 'step_2'} "
        "(step_3, saved inside the streak, holds iteration 2's weights); "
    ) in str(info.value)
    before, inside = final_weights(tmp_path, 2), final_weights(tmp_path, 3)
    assert all(torch.equal(before[k], inside[k]) for k in before)  # skipped: what the line says


def test_overflows_under_a_static_fp16_scale_stop_the_run_and_the_scale_stays(tmp_path, monkeypatch):
    """model.native_amp_static_scale (Megatron's --loss-scale): each overflowing step is skipped with the
    scale unchanged, and trainer.max_consecutive_nonfinite of them in a row stop the run in one line.
    Before, the key did not exist; a scaler that never backs off would have skipped to the end. The
    line counts them as skipped, not as nan iterations: their loss is finite, and Megatron's
    training_log counts a nan iteration only where a skipped iteration's loss is inf or nan (before,
    the line said 1 nan iteration for each, as for a NaN loss)."""

    def overflow_from_step_3(model, batch):
        loss = masked_lm_loss(model, batch)
        if not torch.is_grad_enabled():  # validation
            return loss
        calls.append(1)
        if len(calls) <= 2 * 2:  # 2 micro-batches a step
            return loss
        weight = next(model.parameters()) * 1.0  # a finite loss whose gradients are infinite
        weight.register_hook(lambda grad: torch.full_like(grad, float("inf")))
        return loss + (weight * 0.0).sum()

    calls: list[int] = []
    use_loss_fn(monkeypatch, overflow_from_step_3)
    static = [
        "trainer.precision=16",
        "model.native_amp_static_scale=true",
        "model.native_amp_init_scale=1024",
    ]
    cfg = tiny_config(tmp_path, *MOCK, *static, "trainer.max_consecutive_nonfinite=3", "trainer.max_steps=20")
    with pytest.raises(
        step_loop.TrainingDivergedError,
        match=r"3 iterations in a row \(last at iteration 5: lm loss [\d.]+, grad norm inf\);",
    ) as info:
        run_recording(monkeypatch, cfg)
    assert "\n" not in str(info.value)
    assert str(info.value).endswith(  # the scale, not the learning rate, is what overflows fp16 here
        "; lower model.native_amp_init_scale (1024) or model.optim.lr or raise trainer.max_consecutive_nonfinite"
    )
    lines = [line for line in log_lines(tmp_path) if "number of nan iterations" in line]
    assert [line.split("loss scale:")[1].split("|")[0].strip() for line in lines] == ["1024.0"] * 5
    skipped = [line.split("number of skipped iterations:")[1].split("|")[0].strip() for line in lines]
    assert skipped == ["0", "0", "1", "1", "1"]
    nans = [line.split("number of nan iterations:")[1].split("|")[0].strip() for line in lines]
    assert nans == ["0"] * 5


def test_a_divergence_waiting_for_a_long_background_write_is_not_called_a_hang(tmp_path, monkeypatch):
    """The stop after trainer.max_consecutive_nonfinite waits for the background write of the last good
    save, to name it. That wait sat inside the step's watched end: a write longer than
    trainer.hang_timeout_minutes (minutes for a large model) was reported as a hung rank, exit 76, and
    the requeued job diverged again. Now the wait is watched as a save, with a save's allowance."""
    import threading
    import time

    from gptrain.checkpoint import manager
    from gptrain.train import watchdog

    def nan_from_step_3(model, batch):
        loss = masked_lm_loss(model, batch)
        if not torch.is_grad_enabled():  # validation
            return loss
        calls.append(1)
        return loss * float("nan") if len(calls) > 2 * 2 else loss  # 2 micro-batches a step

    calls: list[int] = []
    use_loss_fn(monkeypatch, nan_from_step_3)
    real_mark, real_wait = manager.CheckpointManager._mark_complete, manager.CheckpointManager.wait
    stop_waits = threading.Event()  # the divergence stop (after step 4's loss) waits for the write

    def noted_wait(self):
        if len(calls) >= 4 * 2:
            stop_waits.set()
        real_wait(self)

    def slow_mark(self, report, checksums):
        """The write of step_2 outlasts the hang timeout (3 s) counted from the stop's wait: a
        watched wait would have its watchdog fire within a timeout and a poll of the step's end."""
        assert stop_waits.wait(timeout=60), "the divergence stop never waited for the background write"
        time.sleep(dogs[0].timeout_s + 2 * dogs[0].poll_s)
        real_mark(self, report, checksums)

    monkeypatch.setattr(manager.CheckpointManager, "wait", noted_wait)
    monkeypatch.setattr(manager.CheckpointManager, "_mark_complete", slow_mark)
    dogs: list[watchdog.Watchdog] = []
    real_start = watchdog.Watchdog.start

    def recorded_start(timeout_minutes, rank, world_size):
        dog = real_start(timeout_minutes, rank, world_size)
        dog.exit_fn = lambda code: None  # the line is kept in `fired`; the test process goes on
        dogs.append(dog)
        return dog

    monkeypatch.setattr(watchdog.Watchdog, "start", staticmethod(recorded_start))
    cfg = tiny_config(
        tmp_path,
        *MOCK,
        *NO_EVALUATION,
        ASYNC,
        "trainer.max_consecutive_nonfinite=2",
        "trainer.hang_timeout_minutes=0.05",
        "trainer.max_steps=20",
    )
    with pytest.raises(step_loop.TrainingDivergedError, match=r"last good checkpoint: .*step_2;"):
        run_recording(monkeypatch, cfg)
    assert [dog.fired for dog in dogs] == [None]
    assert complete_steps(tmp_path / "checkpoints") == [2]


def test_a_non_finite_warning_written_to_a_hung_file_system_is_a_hang(tmp_path, monkeypatch):
    """The warning naming a skipped non-finite iteration was written after the step's watched end: a
    write blocked on a hung shared file system held the run with nothing watching it (one rank: until
    the job's time limit, not requeued). It is watched as the iteration line's write is."""
    import time

    from gptrain.train import results, watchdog

    def nan_at_step_3(model, batch):
        loss = masked_lm_loss(model, batch)
        if not torch.is_grad_enabled():  # validation
            return loss
        calls.append(1)
        return loss * float("nan") if len(calls) in (5, 6) else loss  # 2 micro-batches a step

    calls: list[int] = []
    use_loss_fn(monkeypatch, nan_at_step_3)
    real_write = results.RunLog.to_file

    def hung_write(self, line):
        """The warning's write hangs until the watchdog fires, or 8 s (past its 3 s timeout and a poll)."""
        if line.startswith("warning: iteration 3 skipped"):
            deadline = time.monotonic() + 8.0
            while dogs[0].fired is None and time.monotonic() < deadline:
                time.sleep(0.05)
        real_write(self, line)

    monkeypatch.setattr(results.RunLog, "to_file", hung_write)
    dogs: list[watchdog.Watchdog] = []
    real_start = watchdog.Watchdog.start

    def recorded_start(timeout_minutes, rank, world_size):
        dog = real_start(timeout_minutes, rank, world_size)
        dog.exit_fn = lambda code: None  # the line is kept in `fired`; the test process goes on
        dogs.append(dog)
        return dog

    monkeypatch.setattr(watchdog.Watchdog, "start", staticmethod(recorded_start))
    cfg = tiny_config(tmp_path, *MOCK, *NO_EVALUATION, "trainer.hang_timeout_minutes=0.05")
    code, _ = run_recording(monkeypatch, cfg)
    assert code == 0 and len(dogs) == 1
    assert dogs[0].fired is not None and "iteration 3" in dogs[0].fired, dogs[0].fired


def test_resume_on_indexed_dataset_is_bit_exact(tmp_path, monkeypatch, indexed_corpus):
    data = indexed_corpus
    code, full = run_recording(monkeypatch, tiny_config(tmp_path / "full", *data))
    assert code == 0 and sorted(full) == [1, 2, 3, 4, 5, 6]
    first_cfg = tiny_config(tmp_path / "split", *data, "trainer.max_time=00:00:00:00.001")
    code, first = run_recording(monkeypatch, first_cfg)  # a millisecond: stops after iteration 1
    assert code == EXIT_REQUEUE and sorted(first) == [1]
    code, second = run_recording(monkeypatch, tiny_config(tmp_path / "split", *data))
    assert code == 0 and sorted(second) == [2, 3, 4, 5, 6]
    assert first | second == full  # every loss bit for bit


def checkpoint_weights(step_dir, target):
    """The model tensors of a checkpoint, converted into `target` (never into the run's directory)."""
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    dcp_to_torch_save(step_dir, target)
    return torch.load(target, weights_only=False)["model"]


def files_of(directory):
    return {p.relative_to(directory): (p.stat().st_size, p.stat().st_mtime_ns) for p in directory.rglob("*")}


def spy_on_start_from(monkeypatch):
    """What the run holds right after loading another run's checkpoint."""
    seen = {}
    real = resuming.start_from

    def spying(s, source):
        real(s, source)
        seen.update(source=source, step=s.state.step, consumed=s.state.consumed_samples)
        seen["weights"] = {k: v.detach().clone() for k, v in s.model.state_dict().items()}
        seen["optimizer_state"] = len(s.optimizer.state)

    monkeypatch.setattr(resuming, "start_from", spying)
    return seen


def test_a_run_starts_from_another_runs_checkpoint_then_resumes_its_own(uninterrupted, tmp_path, monkeypatch):
    """Megatron's --load A --save B: B continues A (weights, optimizer, step, samples, RNG) exactly,
    writes only under B, and once B has a checkpoint a restart resumes B, not A."""
    full_dir, _, full_losses = uninterrupted
    run_a, run_b = tmp_path / "a", tmp_path / "b"
    code, _ = run_recording(monkeypatch, tiny_config(run_a, *MOCK), signal_at=4)
    assert code == EXIT_REQUEUE and complete_steps(run_a / "checkpoints") == [2, 4]
    before = files_of(run_a)
    seen = spy_on_start_from(monkeypatch)
    code, losses = run_recording(
        monkeypatch, tiny_config(run_b, *MOCK, f"exp_manager.resume_from_checkpoint={run_a}")
    )
    assert code == 0 and sorted(losses) == [5, 6]
    assert seen["source"] == run_a / "checkpoints" / "step_4"
    assert (seen["step"], seen["consumed"], seen["optimizer_state"] > 0) == (4, 16, True)
    saved = checkpoint_weights(run_a / "checkpoints" / "step_4", tmp_path / "a4.pt")
    assert seen["weights"].keys() == saved.keys()
    assert all(torch.equal(seen["weights"][k], saved[k]) for k in saved)
    assert all(losses[step] == full_losses[step] for step in (5, 6))  # bit for bit: nothing was reset
    b_weights = checkpoint_weights(run_b / "checkpoints" / "step_6", tmp_path / "b6.pt")
    full_weights = checkpoint_weights(full_dir / "checkpoints" / "step_6", tmp_path / "full6.pt")
    assert all(torch.equal(b_weights[k], full_weights[k]) for k in full_weights)
    assert files_of(run_a) == before  # A is read, never written
    assert complete_steps(run_b / "checkpoints") == [6]
    line = next(line for line in log_lines(run_b) if line.startswith("starting from "))
    assert f"starting from {run_a}/checkpoints/step_4 (exp_manager.resume_from_checkpoint;" in line
    assert "loaded model, optim, rng, scaler, schedule, train) at iteration 4, consumed samples 16" in line
    # a requeued B resumes its own checkpoint, not A's
    cfg = tiny_config(run_b, *MOCK, f"exp_manager.resume_from_checkpoint={run_a}", "trainer.max_steps=7")
    code, losses = run_recording(monkeypatch, cfg)
    assert code == 0 and sorted(losses) == [7]
    assert any(
        line.startswith(f"resuming from {run_b}/checkpoints/step_6 at iteration 6")
        for line in log_lines(run_b)
    )
    assert f"exp_manager.resume_from_checkpoint={run_a} not used: this run has checkpoints" in "\n".join(
        log_lines(run_b)
    )
    assert files_of(run_a) == before


def test_finetune_from_a_step_directory_takes_the_weights_only(uninterrupted, tmp_path, monkeypatch):
    """NeMo's resume_from_checkpoint naming one step directory, with Megatron's --finetune semantics."""
    full_dir, _, _ = uninterrupted
    step_4 = full_dir / "checkpoints" / "step_4"
    seen = spy_on_start_from(monkeypatch)
    cfg = tiny_config(
        tmp_path,
        *MOCK,
        f"exp_manager.resume_from_checkpoint={step_4}",
        "exp_manager.finetune=true",
        "trainer.max_steps=2",
    )
    code, losses = run_recording(monkeypatch, cfg)
    assert code == 0 and sorted(losses) == [1, 2]  # the iteration count starts again at 0
    assert (seen["step"], seen["consumed"], seen["optimizer_state"]) == (0, 0, 0)
    saved = checkpoint_weights(step_4, tmp_path / "w.pt")
    assert all(torch.equal(seen["weights"][k], saved[k]) for k in saved)
    assert any("loaded model) at iteration 0" in line for line in log_lines(tmp_path))


def test_nemos_restore_from_ckpt_goes_on_from_the_iteration_with_the_data_from_its_start(
    uninterrupted, tmp_path, monkeypatch
):
    """NeMo's megatron_gpt_config.yaml `model.restore_from_ckpt` (continue_training): weights,
    optimizer and iteration go on, the consumed samples start at 0 (continual pretraining on another
    blend sees it from its first sample; resume_from_checkpoint would skip what the old run read)."""
    full_dir, _, full_losses = uninterrupted
    step_4 = full_dir / "checkpoints" / "step_4"
    seen = spy_on_start_from(monkeypatch)
    code, losses = run_recording(
        monkeypatch, tiny_config(tmp_path, *MOCK, f"model.restore_from_ckpt={step_4}")
    )
    assert code == 0 and sorted(losses) == [5, 6]
    assert (seen["step"], seen["consumed"], seen["optimizer_state"] > 0) == (4, 0, True)
    saved = checkpoint_weights(step_4, tmp_path / "w4.pt")
    assert all(torch.equal(seen["weights"][k], saved[k]) for k in saved)
    assert losses[5] != full_losses[5]  # other samples than the uninterrupted run's fifth step
    lines = log_lines(tmp_path)
    start = next(line for line in lines if line.startswith("starting from "))
    assert "at iteration 4, consumed samples 0 (the data from its first sample" in start
    last = next(line for line in reversed(lines) if "consumed samples:" in line)
    assert "iteration        6/       6" in last and "consumed samples:            8 |" in last


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda root: root / "missing", "missing: does not exist; give a run directory"),
        (
            lambda root: root / "model.ckpt",
            "model.ckpt: is a file, not a checkpoint; pass a run's results dir",
        ),
        (lambda root: root / "empty", "empty: no checkpoints found; pass a run's results dir"),
        (lambda root: root / "torn" / "checkpoints" / "step_3", "step_3: incomplete checkpoint (no COMPLETE"),
        (
            lambda root: root / "hf",
            "hf: a transformers model directory (config.json), not a gptrain checkpoint: import it with "
            "`gptrain import",
        ),
    ],
)
def test_a_bad_checkpoint_to_start_from_is_one_line_naming_it(tmp_path, capsys, make, message):
    from gptrain.cli import main

    (tmp_path / "empty").mkdir()
    (tmp_path / "model.ckpt").write_bytes(b"NeMo")
    (tmp_path / "torn" / "checkpoints" / "step_3").mkdir(parents=True)
    (tmp_path / "hf").mkdir()  # what transformers' save_pretrained writes
    for name in ("config.json", "model.safetensors"):
        (tmp_path / "hf" / name).write_text("{}")
    source = make(tmp_path)
    overrides = [*TINY, *MOCK, f"exp_manager.explicit_log_dir={tmp_path / 'run'}"]
    assert main(["train", "gpt3/126m", *overrides, f"exp_manager.resume_from_checkpoint={source}"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and f"{source}" in err and message in err


def test_async_checkpoint_staging_is_prepared_once_after_the_first_updating_step(monkeypatch):
    """On CUDA the loop has the pinned staging buffer allocated in the background as soon as the
    optimizer state exists (a step that updated); never for synchronous saves or on the CPU."""
    from types import SimpleNamespace

    from gptrain.train.step import StepResult

    prepared = []
    monkeypatch.setattr(saving, "checkpoint_state", lambda *parts: {"state": len(prepared)})
    s = SimpleNamespace(
        checkpoints=SimpleNamespace(async_save=True, prepare_staging=prepared.append),
        device=torch.device("cuda"),
        model=torch.nn.Linear(2, 2), optimizer=None, schedule=None, scaler=None, state=None,
    )  # fmt: skip
    assert not saving.prepare_checkpoint_staging(s, StepResult(loss=float("nan"), nonfinite=True))
    assert prepared == []  # no optimizer state yet: building its state dict would create one
    assert saving.prepare_checkpoint_staging(s, StepResult(loss=2.0, updated=True))
    assert prepared == [{"state": 0}]
    for async_save, device in ((False, "cuda"), (True, "cpu")):
        s.checkpoints.async_save, s.device = async_save, torch.device(device)
        assert saving.prepare_checkpoint_staging(s, StepResult(loss=2.0, updated=True))
    assert len(prepared) == 1


def test_a_checkpoint_with_one_item_per_hyperparameter_resumes_bit_exact(
    uninterrupted, tmp_path, monkeypatch
):
    """Checkpoints saved before hyperparameters were packed per parameter (2026-11-26) resume as
    they did: the loop builds the state to load in the checkpoint's own layout."""
    from gptrain.checkpoint.compat import read_metadata
    from gptrain.parallel import state_dict
    from gptrain.train import state as train_state

    def one_item_per_hyperparameter(model, optimizer, saved=None):
        return state_dict.unpack_param_groups(state_dict.optimizer_state_dict(model, optimizer, saved))

    def packed(step: int) -> bool:
        keys = read_metadata(tmp_path / "checkpoints" / f"step_{step}").state_dict_metadata
        return "optim.param_groups.tok_embeddings.weight" in keys

    full_dir, _, full_losses = uninterrupted
    with monkeypatch.context() as old:
        old.setattr(train_state, "optimizer_state_dict", one_item_per_hyperparameter)
        code, first = run_recording(monkeypatch, tiny_config(tmp_path, *MOCK), signal_at=3)
    assert code == EXIT_REQUEUE and sorted(first) == [1, 2, 3]
    assert not packed(3)  # the old layout, as asked
    code, second = run_recording(monkeypatch, tiny_config(tmp_path, *MOCK))
    assert code == 0 and sorted(second) == [4, 5, 6]
    for step in range(1, 7):
        assert (first | second)[step] == full_losses[step], step
    resumed, full = final_weights(tmp_path, 6), final_weights(full_dir, 6)
    assert all(torch.equal(resumed[k], full[k]) for k in full)
    assert packed(6)


@pytest.mark.parametrize(("save_last", "steps"), [("true", [2, 3]), ("false", [2])])
def test_save_last_decides_the_checkpoint_at_the_end_off_the_interval(
    tmp_path, monkeypatch, save_last, steps
):
    cfg = tiny_config(
        tmp_path,
        *MOCK,
        "trainer.max_steps=3",
        f"exp_manager.checkpoint_callback_params.save_last={save_last}",
    )
    code, _ = run_recording(monkeypatch, cfg)
    assert code == 0 and complete_steps(tmp_path / "checkpoints") == steps


def test_checkpoints_off_save_nothing_and_a_stop_ends_the_run_without_a_requeue(tmp_path, monkeypatch):
    """NeMo's benchmark scripts set create_checkpoint_callback=False; before, it was ignored: the run
    saved step_N, and the same command run again was refused over that checkpoint."""
    off = ["exp_manager.create_checkpoint_callback=false", "exp_manager.resume_if_exists=false"]
    code, losses = run_recording(monkeypatch, tiny_config(tmp_path, *MOCK, *off))
    assert code == 0 and sorted(losses) == [1, 2, 3, 4, 5, 6]
    assert not list((tmp_path / "checkpoints").glob("step_*"))
    code, _ = run_recording(monkeypatch, tiny_config(tmp_path, *MOCK, *off), signal_at=3)  # the rerun starts
    assert code == 0  # stopped by the signal: nothing to resume from, so not requeued
    assert not list((tmp_path / "checkpoints").glob("step_*"))
    stopped = [line for line in log_lines(tmp_path) if line.startswith("stopping at iteration")]
    assert stopped and "nothing saved, exit 0 (not requeued)" in stopped[-1]


def test_rows_a_resume_leaves_out_are_said_in_the_log(tmp_path, monkeypatch):
    """A smaller position table (or fewer vocabulary rows than an imported model's) loaded the
    first rows and dropped the rest without a word; later checkpoints no longer have them."""
    run = ["trainer.max_steps=2", "exp_manager.checkpoint_callback_params.every_n_train_steps=2"]
    code, _ = run_recording(
        monkeypatch, tiny_config(tmp_path, *MOCK, *run, "model.max_position_embeddings=32")
    )
    assert code == 0
    more = ["trainer.max_steps=3", "model.max_position_embeddings=16"]
    code, _ = run_recording(monkeypatch, tiny_config(tmp_path, *MOCK, *more))
    assert code == 0
    warnings = [line for line in log_lines(tmp_path) if "are not loaded" in line]
    assert warnings == [
        "warning: model.pos_embeddings.weight: the checkpoint has 32 rows, this run's model 16; rows 16-31 "
        "(rows past this run's table) are not loaded and later checkpoints will not have them"
    ]


def test_the_last_step_and_the_steps_before_a_stop_are_logged(tmp_path, monkeypatch):
    """Lines came only at the first step and every log_every_n_steps: a run of 6 steps logging every
    4 ended on `status` at step 4 of 6, and the losses of the steps between the last line and a stop
    were never written (not in the log, not in TensorBoard)."""
    import re

    every = "trainer.log_every_n_steps=4"
    code, _ = run_recording(monkeypatch, tiny_config(tmp_path, *MOCK, every), signal_at=3)
    assert code == EXIT_REQUEUE
    code, _ = run_recording(monkeypatch, tiny_config(tmp_path, *MOCK, every))
    assert code == 0
    logged = [int(m[1]) for line in log_lines(tmp_path) if (m := re.search(r"iteration +(\d+)/ +6 \|", line))]
    assert logged == [1, 3, 4, 6]  # 3: flushed at the stop; 4: the resumed process's first; 6: the last


def test_validation_and_saves_are_not_step_time_in_the_step_times_files(tmp_path, monkeypatch):
    """The per-rank step-times lines (`gptrain status`'s straggler line) took in every validation and
    save of their interval, the validation a resumed run runs first included, so a line after one
    showed common minutes that hid a slow rank; they are left out, as in the iteration line."""
    import json

    from gptrain.train import meter, step_times

    clock = ShiftedClock()
    monkeypatch.setattr(meter, "time", clock)
    monkeypatch.setattr(step_times, "time", clock)
    real_open, real_evaluate, real_save = (
        step_loop.StepTimes.open,
        eval_splits.evaluate,
        saving.save_checkpoint,
    )
    # a file as rank 0 of two writes it (a world of one writes none)
    monkeypatch.setattr(step_loop.StepTimes, "open", lambda log_dir, rank, world: real_open(log_dir, rank, 2))

    def taking_1000_s(real):
        def slow(*args, **kwargs):
            clock.offset += 1000.0
            return real(*args, **kwargs)

        return slow

    monkeypatch.setattr(eval_splits, "evaluate", taking_1000_s(real_evaluate))
    monkeypatch.setattr(saving, "save_checkpoint", taking_1000_s(real_save))
    code, _ = run_recording(monkeypatch, tiny_config(tmp_path, *MOCK), signal_at=3)  # saves at 2 and 3
    assert code == EXIT_REQUEUE
    clock.offset = 0.0  # a new process (the meter and the file take their start from the real clock)
    code, _ = run_recording(monkeypatch, tiny_config(tmp_path, *MOCK))  # validates 3 first; saves 4, 6
    assert code == 0
    rows = [json.loads(line) for line in (tmp_path / "step_times" / "rank-0.jsonl").read_text().splitlines()]
    assert [row["step"] for row in rows] == [2, 3, 5, 6]  # 1, 4: each process's first, its start-up
    assert max(row["step_ms"] for row in rows) < 1000 * 1000.0


@pytest.mark.parametrize("rank, says", [(0, True), (1, False), (2, True)])
def test_the_checkpoint_space_warning_reaches_the_console_of_a_multi_rank_run(tmp_path, rank, says):
    """Only rank 0 checked the disk for the run's checkpoints, and of a run of several ranks only the
    logging rank (the last) prints to the console: the warning that saves would fill the disk
    stayed in rank 0's log file. The logging rank says it too."""
    from types import SimpleNamespace

    from gptrain.parallel.mesh import World
    from gptrain.train.model_config import build_model_config

    cfg = tiny_config(tmp_path, *MOCK)
    said: list[str] = []
    s = SimpleNamespace(
        cfg=cfg,
        world=World(rank=rank, world_size=3, local_rank=rank, master_addr="", master_port=0),
        logging_rank=rank == 2,
        flops_per_iteration=1.0,
        num_microbatches=1,
        schedule=SimpleNamespace(spec=builders.schedule_spec(cfg)),
        checkpoints=SimpleNamespace(space_warning=lambda size: "the disk is too small"),
        log=said.append,
    )
    loop.log_start(s, build_model_config(cfg, 128), tmp_path)
    assert ("warning: the disk is too small" in said) == says


@pytest.mark.parametrize("overflows", [{2, 3}, {2, 3, 5}])
def test_an_fp16_run_stopped_and_resumed_scales_its_loss_as_one_that_was_not(
    tmp_path, monkeypatch, overflows
):
    """The dynamic loss scale's trackers go through the checkpoint a stop saves at iteration 4 (after
    two overflows: hysteresis spent, one clean iteration counted): the resumed run grows the scale at
    5 (a growth interval of 2), or halves it at an overflow there, as the run that was never stopped."""
    started_at = [0]

    def overflow_at(model, batch):
        loss = masked_lm_loss(model, batch)
        if not torch.is_grad_enabled():  # validation
            return loss
        calls.append(1)
        if started_at[0] + (len(calls) + 1) // 2 not in overflows:  # 2 micro-batches a step
            return loss
        weight = next(model.parameters()) * 1.0  # a finite loss whose gradients are infinite
        weight.register_hook(lambda grad: torch.full_like(grad, float("inf")))
        return loss + (weight * 0.0).sum()

    def scales(run):
        lines = [line for line in log_lines(run) if "loss scale:" in line]
        return [float(line.split("loss scale:")[1].split("|")[0]) for line in lines]

    calls: list[int] = []
    use_loss_fn(monkeypatch, overflow_at)
    fp16 = [
        *MOCK,
        "trainer.precision=16",
        "model.native_amp_init_scale=1024",
        "model.native_amp_growth_interval=2",
        "model.hysteresis=2",
        "trainer.max_steps=8",
        "exp_manager.resume_if_exists=true",
    ]
    assert run_recording(monkeypatch, tiny_config(tmp_path / "whole", *fp16))[0] == 0
    calls.clear()
    assert run_recording(monkeypatch, tiny_config(tmp_path / "split", *fp16), signal_at=4)[0] == EXIT_REQUEUE
    calls.clear()
    started_at[0] = 4
    assert run_recording(monkeypatch, tiny_config(tmp_path / "split", *fp16))[0] == 0
    assert scales(tmp_path / "split") == scales(tmp_path / "whole")
    grown_or_halved = 1024.0 if 5 not in overflows else 256.0
    assert scales(tmp_path / "whole")[:5] == [1024.0, 1024.0, 512.0, 512.0, grown_or_halved]


@pytest.mark.parametrize(
    ("max_steps", "blocks"), [(6, ["3", "6", "6 on validation set"]), (7, ["3", "6", "7 on validation set"])]
)
def test_the_end_validation_is_megatrons_on_validation_set_block(tmp_path, monkeypatch, max_steps, blocks):
    """Megatron validates on its interval ('validation loss at iteration N'), then after training again
    ('... at iteration N on validation set'), then the test split ('... on test set'). The end's block
    was printed as an interval's, and the interval's was missing where the end is on the interval; now
    both, from the one evaluation (gptrain evaluates the same batches each time: a second gives the
    same loss), each between its dashed lines."""
    code, _ = run_recording(monkeypatch, tiny_config(tmp_path, *MOCK, f"trainer.max_steps={max_steps}"))
    assert code == 0
    lines = log_lines(tmp_path)
    texts = [line for line in lines if line.startswith(" validation loss at iteration ")]
    assert [text.split(" | ")[0].removeprefix(" validation loss at iteration ") for text in texts] == [
        *blocks,
        f"{max_steps} on test set",
    ]
    for text in texts:
        at = lines.index(text)
        assert lines[at - 1] == lines[at + 1] == "-" * (len(text) + 1)
    if max_steps == 6:  # the end on the interval: one evaluation, two blocks
        assert texts[1].split(" | ", 1)[1] == texts[2].split(" | ", 1)[1]


def test_the_memory_report_comes_every_log_memory_interval_iterations(tmp_path, monkeypatch):
    """Megatron's --log-memory-interval N (trainer.log_memory_interval): each rank's memory report
    every N iterations, beside the one at the end; before, the flag was accepted without effect.
    An iteration is reported once: the last one by the end's report (after the end's validation),
    and a run stopped at a reported iteration gets no second one (it printed both)."""
    reported: list[tuple[str, int]] = []
    monkeypatch.setattr(step_loop, "log_memory", lambda log, device, step: reported.append(("every", step)))
    monkeypatch.setattr(builders, "log_memory", lambda log, device, step: reported.append(("end", step)))
    cfg = tiny_config(tmp_path, *MOCK, "trainer.log_every_n_steps=1", "trainer.log_memory_interval=2")
    code, _ = run_recording(monkeypatch, cfg)
    assert code == 0 and reported == [("every", 2), ("every", 4), ("end", 6)]
    reported.clear()
    cfg = tiny_config(
        tmp_path / "stopped", *MOCK, "trainer.log_every_n_steps=1", "trainer.log_memory_interval=2"
    )
    code, _ = run_recording(monkeypatch, cfg, signal_at=4)
    assert code == EXIT_REQUEUE and reported == [("every", 2), ("every", 4)]
    with pytest.raises(ConfigError, match=r"^trainer.log_memory_interval: must be at least 1, or null"):
        tiny_config(tmp_path, *MOCK, "trainer.log_memory_interval=0")
