"""Megatron's weight-decay increment (model.optim.weight_decay_incr_style, from --weight-decay-incr-style):
every step's decay against OptimizerParamScheduler.get_wd restated here in float64 (in samples, its
unit), the decaying weights only, and a resume that goes on with the same decays.

Tolerance: gptrain counts in steps of the full batch (a run in samples is train_samples / batch steps),
so the ratio differs from Megatron's by a few ulp (~1e-16 relative), which the cosine carries at most
pi/2-fold: the decays stay within 1e-14 relative of the end decay."""

import math
import shlex

import pytest

from gptrain.config import load_training_config
from gptrain.errors import ConfigError
from gptrain.megatron.translate import translate
from gptrain.train.weight_decay_schedule import wd_at, weight_decay_spec

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")

BASE = (
    "--num-layers 2 --hidden-size 8 --num-attention-heads 2 --seq-length 16 --micro-batch-size 1"
    " --mock-data --vocab-size 64"
)


def megatron_wd(num_steps, *, start, end, incr_steps, style):
    """OptimizerParamScheduler.get_wd (Megatron-LM core), lengths in samples."""
    if num_steps > incr_steps:
        return end
    ratio = float(num_steps) / float(incr_steps)
    coeff = ratio if style == "linear" else 0.5 * (math.cos(math.pi * (1 - ratio)) + 1.0)
    return start + coeff * (end - start)


@pytest.mark.parametrize("style", ["linear", "cosine"])
@pytest.mark.parametrize(
    ("run", "batch", "incr_samples", "steps"),
    [
        ("--train-iters 50", 4, 200, 50),
        ("--train-samples 403", 8, 403, 50),  # 50 iterations, Megatron's increment over 403 samples
        ("--train-samples 400 --rampup-batch-size 2 2 120", 8, 400, None),
    ],
)
def test_every_steps_weight_decay_is_megatrons(style, run, batch, incr_samples, steps):
    flags = f"{BASE} --global-batch-size {batch} {run} --weight-decay-incr-style {style}"
    flags += " --start-weight-decay 0.01 --end-weight-decay 0.1"
    cfg = load_training_config(None, translate(shlex.split(flags), {}).overrides, report_ignored=False)
    spec = weight_decay_spec(cfg)
    assert spec is not None and (spec.style, spec.start, spec.end) == (style, 0.01, 0.1)
    from gptrain.train.rampup import BatchRamp

    ramp = BatchRamp.from_config(cfg.model.rampup_batch_size, batch, 1)
    step, consumed = 0.0, 0
    for _ in range(cfg.trainer.max_steps + 3):
        expected = megatron_wd(consumed, start=0.01, end=0.1, incr_steps=incr_samples, style=style)
        assert wd_at(step, spec) == pytest.approx(expected, rel=1e-14, abs=1e-15), consumed
        step += ramp.at(consumed) / batch
        consumed += ramp.at(consumed)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["model.optim.weight_decay_incr_style=linear"], "weight_decay_incr_style=linear needs"),
        (
            ["model.optim.start_weight_decay=0.1"],
            "model.optim.start_weight_decay=0.1 with model.optim.weight_decay_incr_style=constant",
        ),
        (
            ["model.optim.weight_decay_incr_style=cosine", "model.optim.start_weight_decay=0.2",
             "model.optim.end_weight_decay=0.1"],
            "start_weight_decay=0.2 and model.optim.end_weight_decay=0.1: give 0 <= start <= end",
        ),
        (["model.optim.weight_decay_incr_style=square"], "'square' is not one of constant, linear, cosine"),
    ],
)  # fmt: skip
def test_bad_increments_are_one_line_naming_the_keys(overrides, message):
    cfg = load_training_config("gpt3/126m", overrides, report_ignored=False)
    with pytest.raises(ConfigError, match=message):
        weight_decay_spec(cfg)


def test_the_run_decays_its_matrices_by_the_increment_and_resumes_with_it(tmp_path, monkeypatch):
    """A tiny run with a linear increment over its 6 steps: before each step the decaying group holds
    Megatron's decay of that step and the 1-D parameters none; a run stopped at step 3 and resumed
    has the same decays, and the resume does not call the scheduled decay a changed setting."""
    from train_e2e_helpers import MOCK, log_lines, tiny_config

    from gptrain.errors import EXIT_REQUEUE
    from gptrain.train import loop, step_loop

    shape = [
        *MOCK,
        "exp_manager.resume_if_exists=true",
        "trainer.max_steps=6",
        "trainer.limit_val_batches=0",
        "trainer.limit_test_batches=0",
        "model.num_layers=1",
        "model.hidden_size=16",
        "model.num_attention_heads=2",
        "model.encoder_seq_length=8",
        "model.optim.weight_decay_incr_style=linear",
        "model.optim.start_weight_decay=0.0",
        "model.optim.end_weight_decay=0.3",
    ]

    def decays(cfg, stop_at=None):
        seen = {}
        real = step_loop.record

        def recording(session, result, *args):
            seen[session.state.step + 1] = [group["weight_decay"] for group in session.optimizer.param_groups]
            real(session, result, *args)
            if session.state.step == stop_at:
                import os
                import signal

                os.kill(os.getpid(), signal.SIGUSR1)

        monkeypatch.setattr(step_loop, "record", recording)
        code = loop.train(cfg)
        monkeypatch.setattr(step_loop, "record", real)
        return code, seen

    code, whole = decays(tiny_config(tmp_path / "whole", *shape))
    assert code == 0
    expected = {
        i: [megatron_wd(i - 1, start=0.0, end=0.3, incr_steps=6, style="linear"), 0.0] for i in range(1, 7)
    }
    assert whole == expected  # the same float64 operations on the same step counts
    stopped = tmp_path / "stopped"
    assert decays(tiny_config(stopped, *shape), stop_at=3)[0] == EXIT_REQUEUE
    code, resumed = decays(tiny_config(stopped, *shape))
    assert code == 0 and resumed == {i: whole[i] for i in (4, 5, 6)}
    assert not [line for line in log_lines(stopped) if "weight_decay" in line]


RESUME_SHAPE = [
    "exp_manager.resume_if_exists=true",
    "trainer.max_steps=6",
    "trainer.limit_val_batches=0",
    "trainer.limit_test_batches=0",
    "model.num_layers=1",
    "model.hidden_size=16",
    "model.num_attention_heads=2",
    "model.encoder_seq_length=8",
]
LINEAR = ["model.optim.weight_decay_incr_style=linear", "model.optim.start_weight_decay=0.0"]


def stopped_and_resumed(monkeypatch, run, first, then):
    """A tiny run with `first` stopped (SIGUSR1) after step 2, resumed with `then`: the decaying group's
    decay before each resumed step, and the resumed run's log lines that name the weight decay."""
    from train_e2e_helpers import MOCK, log_lines, tiny_config

    from gptrain.errors import EXIT_REQUEUE
    from gptrain.train import loop, step_loop

    real, seen = step_loop.record, {}

    def recording(session, result, *args):
        seen[session.state.step + 1] = session.optimizer.param_groups[0]["weight_decay"]
        real(session, result, *args)
        if session.state.step == 2 and not seen.get("resumed"):
            import os
            import signal

            os.kill(os.getpid(), signal.SIGUSR1)

    monkeypatch.setattr(step_loop, "record", recording)
    assert loop.train(tiny_config(run, *MOCK, *RESUME_SHAPE, *first)) == EXIT_REQUEUE
    seen.clear()
    seen["resumed"] = True
    before = len(log_lines(run))
    assert loop.train(tiny_config(run, *MOCK, *RESUME_SHAPE, *then)) == 0
    monkeypatch.setattr(step_loop, "record", real)
    lines = [line for line in log_lines(run)[before:] if "weight decay" in line or "weight_decay" in line]
    return {step: decay for step, decay in seen.items() if step != "resumed"}, lines


def test_a_resume_that_changes_the_weight_decay_says_so_also_with_an_increment(tmp_path, monkeypatch):
    """Megatron's scheduler state holds the increment's style, bounds and length; a resume whose config
    changed them says so in one line with the decay before and after (the config's applies), and the
    decay of each step, which the increment changes, is not called a change."""
    decays, lines = stopped_and_resumed(
        monkeypatch,
        tmp_path / "to_increment",
        ["model.optim.weight_decay=0.1"],
        [*LINEAR, "model.optim.end_weight_decay=0.9"],
    )
    assert decays == {
        i: megatron_wd(i - 1, start=0.0, end=0.9, incr_steps=6, style="linear") for i in range(3, 7)
    }
    assert lines == [
        "weight decay changed since the checkpoint (this run's config applies): constant 0.1 -> linear from 0 to"
        " 0.9 over 6 steps (model.optim.weight_decay, weight_decay_incr_style, start_weight_decay,"
        " end_weight_decay); weight decay of iteration 3: 0.1 by the checkpoint's, 0.3 now (set them back to go"
        " on with the checkpoint's)"
    ]
    increment = [*LINEAR, "model.optim.end_weight_decay=0.3"]
    _, lines = stopped_and_resumed(
        monkeypatch, tmp_path / "end", increment, [*LINEAR, "model.optim.end_weight_decay=0.6"]
    )
    assert lines == [
        "weight decay changed since the checkpoint (this run's config applies): linear from 0 to 0.3 over 6 steps"
        " -> linear from 0 to 0.6 over 6 steps (model.optim.weight_decay, weight_decay_incr_style,"
        " start_weight_decay, end_weight_decay); weight decay of iteration 3: 0.1 by the checkpoint's, 0.2 now"
        " (set them back to go on with the checkpoint's)"
    ]
    _, lines = stopped_and_resumed(
        monkeypatch, tmp_path / "to_constant", increment, ["model.optim.weight_decay=0.1"]
    )
    assert len(lines) == 1 and "linear from 0 to 0.3 over 6 steps -> constant 0.1" in lines[0], lines
    assert stopped_and_resumed(monkeypatch, tmp_path / "same", increment, increment)[1] == []


def test_from_checkpoint_takes_the_checkpoints_weight_decay(tmp_path, monkeypatch):
    """Megatron's --use-checkpoint-opt_param-scheduler takes start_wd, end_wd, wd_incr_steps and
    wd_incr_style from the checkpoint: the resumed steps decay by the checkpoint's increment (or its
    constant), said in the line naming what was taken, and no change is then said."""
    taking = ["model.optim.sched.from_checkpoint=true"]
    increment = [*LINEAR, "model.optim.end_weight_decay=0.3"]
    decays, lines = stopped_and_resumed(
        monkeypatch, tmp_path / "increment", increment, [*LINEAR, "model.optim.end_weight_decay=0.9", *taking]
    )
    assert decays == {
        i: megatron_wd(i - 1, start=0.0, end=0.3, incr_steps=6, style="linear") for i in range(3, 7)
    }
    assert lines == [
        "learning-rate schedule from the checkpoint (model.optim.sched.from_checkpoint=true), not this run's"
        " config: weight decay linear from 0 to 0.3 over 6 steps (config linear from 0 to 0.9 over 6 steps)"
    ]
    decays, lines = stopped_and_resumed(
        monkeypatch, tmp_path / "constant", ["model.optim.weight_decay=0.1"], [*increment, *taking]
    )
    assert decays == dict.fromkeys(range(3, 7), 0.1)  # Megatron's constant: start_wd = end_wd = weight_decay
    assert lines == [
        "learning-rate schedule from the checkpoint (model.optim.sched.from_checkpoint=true), not this run's"
        " config: weight decay constant 0.1 (config linear from 0 to 0.3 over 6 steps)"
    ]


def test_from_checkpoint_keeps_the_configs_weight_decay_where_the_checkpoint_records_none():
    """A checkpoint saved before the weight decay was recorded: the config's applies, said in one line."""
    from types import SimpleNamespace

    from gptrain.train.resuming import log_schedule_change
    from gptrain.train.schedule import LRSchedule, ScheduleSpec
    from gptrain.train.weight_decay_schedule import WeightDecaySpec

    class Optimizer:
        param_groups = [{"lr": 0.0, "weight_decay": 0.3}, {"lr": 0.0, "weight_decay": 0.0}]

    increment = WeightDecaySpec("linear", 0.0, 0.3, 6)
    schedule = LRSchedule(Optimizer(), ScheduleSpec("Constant", 1.0, 0.0, 6, global_batch_size=4), increment)
    schedule.load_state_dict({"step": 0, "global_batch_size": 4})  # as an older gptrain saved it
    lines = []
    cfg = SimpleNamespace(
        model=SimpleNamespace(optim=SimpleNamespace(sched=SimpleNamespace(from_checkpoint=True)))
    )
    session = SimpleNamespace(
        cfg=cfg,
        schedule=schedule,
        state=SimpleNamespace(step=0),
        log=lines.append,
        schedule_names=lambda *_: None,
    )
    log_schedule_change(session)
    assert schedule.weight_decay == increment
    assert lines == [
        "model.optim.sched.from_checkpoint=true: the checkpoint records no weight decay (saved before gptrain"
        " recorded it), so this run's config's applies: linear from 0 to 0.3 over 6 steps"
    ]
