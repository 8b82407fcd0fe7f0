"""Batch-size ramp-up: Megatron's rule by hand, its iteration count, the errors, and a real run."""

import re

import pytest
from train_e2e_helpers import MOCK, log_lines, run_recording, tiny_config

from gptrain.errors import ConfigError
from gptrain.train.rampup import BatchRamp


def test_global_batch_follows_megatrons_rule():
    # gbs 16 from 4 by 4 over 30 samples: 3 increments, one every 10 consumed samples.
    ramp = BatchRamp.from_config([4, 4, 30], 16, micro_times_dp=4)
    consumed, batches = 0, []
    for _ in range(7):
        batches.append(ramp.at(consumed))
        consumed += batches[-1]
    assert batches == [4, 4, 4, 8, 12, 16, 16]  # consumed: 0, 4, 8, 12, 20, 32, 48
    assert BatchRamp.from_config(None, 16, 4).at(0) == 16


def test_iterations_for_train_samples_count_the_ramp():
    ramp = BatchRamp.from_config([4, 4, 30], 16, micro_times_dp=4)
    # ramp steps while consumed <= 30: 4, 4, 4, 8, 12 (consumed 32), then (64 - 32) // 16 = 2 more.
    assert ramp.iterations_for(64) == 7
    assert BatchRamp.from_config(None, 16, 1).iterations_for(64) == 4


@pytest.mark.parametrize(
    "value, message",
    [
        ([4, 4], "three positive integers"),
        ([4, 5, 30], "must be a non-negative multiple of the increment 5"),
        ([2, 2, 30], "the start 2 is not a multiple of model.micro_batch_size x data-parallel size = 4"),
        ([20, 4, 30], "minus the start 20"),
    ],
)
def test_impossible_ramps_are_one_line_errors(value, message):
    with pytest.raises(ConfigError, match=re.escape(message)) as error:
        BatchRamp.from_config(value, 16, micro_times_dp=4)
    assert str(error.value).startswith("model.rampup_batch_size=") and "\n" not in str(error.value)


RAMP = ["model.rampup_batch_size=[2,2,12]", "model.micro_batch_size=2", "model.global_batch_size=8",
        "model.hidden_dropout=0", "model.attention_dropout=0", "trainer.max_steps=6"]  # fmt: skip


def logged(lines: list[str], field: str) -> list[int]:
    return [int(m.group(1)) for line in lines if (m := re.search(rf"{field}: +(\d+) \|", line))]


def test_training_ramps_the_batch_and_resumes_mid_ramp_exactly(tmp_path, monkeypatch):
    code, full = run_recording(monkeypatch, tiny_config(tmp_path / "full", *MOCK, *RAMP))
    assert code == 0
    lines = log_lines(tmp_path / "full")
    # 8 from 2 by 2 over 12 samples: an increment every 4 samples (Megatron's rule).
    assert logged(lines, "global batch size") == [2, 2, 4, 6, 8, 8]
    assert logged(lines, "consumed samples") == [2, 4, 8, 14, 22, 30]
    code, first = run_recording(monkeypatch, tiny_config(tmp_path / "split", *MOCK, *RAMP), signal_at=3)
    code, second = run_recording(monkeypatch, tiny_config(tmp_path / "split", *MOCK, *RAMP))
    assert code == 0 and {**first, **second} == full  # bit for bit across the resume


def test_ramp_steps_move_the_learning_rate_schedule_by_their_share_of_the_batch():
    from gptrain.train.schedule import LRSchedule, ScheduleSpec

    class Optimizer:
        param_groups = [{}]

    schedule = LRSchedule(
        Optimizer(), ScheduleSpec("LinearAnnealing", 1.0, 0.0, max_steps=10, warmup_steps=4)
    )
    for share in (0.25, 0.25, 0.5):  # three ramp steps of 2, 2 and 4 samples out of 8
        schedule.advance(share)
    assert schedule.step == 1.0 and schedule.apply() == pytest.approx(0.25)
    assert schedule.state_dict()["step"] == 1.0


def test_samples_for_counts_the_ramps_smaller_batches_then_full_ones():
    ramp = BatchRamp.from_config([2, 2, 8], 4, 2)
    sizes, consumed = [], 0
    for _ in range(6):  # the batch of each step, by Megatron's rule
        sizes.append(ramp.at(consumed))
        consumed += sizes[-1]
    assert [ramp.samples_for(n) for n in range(7)] == [sum(sizes[:n]) for n in range(7)]
    assert BatchRamp.from_config(None, 4, 2).samples_for(5) == 20


def test_train_samples_below_what_the_steps_consume_do_not_run_the_split_out(tmp_path, monkeypatch, capsys):
    """Megatron's iteration count for --train-samples can overshoot inside a ramp (5 steps of
    2, 2, 2, 2, 4 samples here, 12 against 8): the split is built for what the steps consume, said in
    the run's log with the other training notes (it went to stderr alone)."""
    overrides = ["model.rampup_batch_size=[2,2,8]", "trainer.max_steps=5", "trainer.train_samples=8"]
    cfg = tiny_config(tmp_path, *MOCK, *overrides, "trainer.limit_val_batches=0")
    code, losses = run_recording(monkeypatch, cfg)
    assert code == 0 and sorted(losses) == [1, 2, 3, 4, 5]
    note = (
        "the train split built for trainer.train_samples=8 holds 8 samples, fewer than the 12 that"
        " trainer.max_steps read: it is built for 12"
    )
    assert [line for line in log_lines(tmp_path) if "train split built for" in line] == [note]
    assert "train split built for" not in capsys.readouterr().err
