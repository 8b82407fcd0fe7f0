"""Issue 14, case 7: a schedule that cannot happen is a warning at start."""

from __future__ import annotations

import pytest
from reliability_helpers import TINY, train_args

from gptrain.cli import main
from gptrain.config import load_training_config
from gptrain.errors import ConfigError
from gptrain.train.builders import schedule_spec
from gptrain.train.rampup import BatchRamp
from gptrain.train.schedule import ScheduleSpec, lr_at
from gptrain.train.schedule_checks import schedule_warnings

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")


def spec(**fields) -> ScheduleSpec:
    base = {"name": "CosineAnnealing", "lr": 6e-4, "min_lr": 6e-5, "max_steps": 1000}
    return ScheduleSpec(**{**base, **fields})


def test_the_tutorials_200_step_run_of_gpt3_126m_warns_that_lr_is_never_reached():
    cfg = load_training_config("gpt3/126m", ["trainer.max_steps=200"])
    [warning] = schedule_warnings(schedule_spec(cfg), cfg.trainer.max_steps)
    assert "model.optim.sched.warmup_steps=636 is not shorter than trainer.max_steps=200" in warning
    highest = max(lr_at(step, schedule_spec(cfg)) for step in range(200))
    assert highest < cfg.model.optim.lr and f"at most {highest:.3g}" in warning


def test_warmup_plus_constant_leaving_no_decay():
    [warning] = schedule_warnings(spec(warmup_steps=600, constant_steps=400), 1000)
    assert "leaves no decay" in warning
    assert lr_at(601, spec(warmup_steps=600, constant_steps=400)) == pytest.approx(
        6e-5
    )  # the drop it warns of


def test_decay_ending_after_the_run_or_long_before_it():
    [after] = schedule_warnings(spec(max_steps=5000), 1000)
    assert "decay ends after the run" in after and f"{lr_at(999, spec(max_steps=5000)):.3g}" in after
    [before] = schedule_warnings(spec(max_steps=500), 1000)
    assert "ends long before the run" in before and "last 500 steps" in before
    assert schedule_warnings(spec(max_steps=950), 1000) == []  # a short tail is fine


def test_a_decay_ending_within_the_last_step_is_the_runs():
    """The AWS tutorial's --train-samples 146484375 at batch 288 without --lr-decay-samples: Megatron
    decays over the samples, 508626.3 steps, and trains 508626. Before: "the decay ends after the
    run ... the last rate is 6e-06, not min_lr=6e-06"."""
    assert schedule_warnings(spec(max_steps=146484375 / 288), 508626) == []
    [after] = schedule_warnings(spec(max_steps=508627), 508626)  # a whole step more: said
    assert "decay ends after the run" in after


def test_sensible_and_constant_schedules_give_no_warning():
    assert schedule_warnings(spec(warmup_steps=100, constant_steps=100), 1000) == []
    assert schedule_warnings(spec(name="Constant", warmup_steps=100), 1000) == []


def test_a_constant_schedule_warns_of_a_warmup_longer_than_the_run():
    [warning] = schedule_warnings(spec(name="Constant", warmup_steps=5000), 1000)
    assert "warmup_steps=5000 is not shorter than trainer.max_steps=1000" in warning


def test_min_lr_above_lr_is_an_error_not_a_warning():
    with pytest.raises(ConfigError, match="min_lr=0.1 is above model.optim.lr"):
        spec(min_lr=0.1)


def test_the_warning_is_in_the_run_log(tmp_path, capsys):
    assert main(train_args(tmp_path, "model.optim.sched.warmup_steps=10", "trainer.max_steps=2")) == 0
    out = capsys.readouterr().out
    assert "warning: model.optim.sched.warmup_steps=10 is not shorter than trainer.max_steps=2" in out
    log = (tmp_path / "nemo_log_globalrank-0_localrank-0.txt").read_text()
    assert "warmup_steps=10 is not shorter" in log


def megatron_config(*flags: str):
    """The config `gptrain megatron` trains for Megatron flags (a tiny mock-data model)."""
    import shlex

    from gptrain.megatron.translate import translate

    base = (
        "--num-layers 2 --hidden-size 8 --num-attention-heads 2 --seq-length 16 --micro-batch-size 8"
        " --mock-data --vocab-size 64 --lr 1e-3 --min-lr 1e-4 --lr-decay-style cosine --global-batch-size 64"
    )
    return load_training_config(None, translate(shlex.split(base + " " + " ".join(flags)), {}).overrides)


def megatron_iterations_at_min_lr(start, increment, ramp_samples, batch, train_samples, decay_samples):
    """Megatron's own count, written from its rules: the iterations of --train-samples under
    --rampup-batch-size (the partial last batch dropped) whose rate is min_lr, i.e. that start with at
    least --lr-decay-samples consumed (its scheduler counts samples)."""
    per_increment = ramp_samples / ((batch - start) // increment)
    consumed, starts = 0, []
    while True:
        size = batch if consumed > ramp_samples else start + int(consumed / per_increment) * increment
        if consumed + size > train_samples and consumed > ramp_samples:
            break
        starts.append(consumed)
        consumed += size
    return len(starts), sum(1 for s in starts if s >= decay_samples)


def test_a_ramp_up_schedule_in_samples_warns_in_megatrons_counts():
    """Megatron's GPT-3 recipe shape: the decay ends before the train samples, under a ramp-up. Before,
    the warning counted the ramp's iterations as full batches (28,702 steps at min_lr for Megatron's
    175B run, 12,714 in fact) and said to set model.optim.sched.max_steps=null, which it was."""
    cfg = megatron_config(
        "--train-samples 40000 --lr-decay-samples 30000 --lr-warmup-samples 640 --rampup-batch-size 8 8 4096"
    )
    iterations, at_min_lr = megatron_iterations_at_min_lr(8, 8, 4096, 64, 40000, 30000)
    assert cfg.trainer.max_steps == iterations
    [warning] = schedule_warnings_of(cfg)
    assert f"the last {at_min_lr} steps run at min_lr" in warning
    assert "model.optim.sched.decay_samples=30000" in warning and "max_steps=null" not in warning
    consumed = BatchRamp.from_config([8, 8, 4096], 64, 1).samples_for(iterations)
    assert f"set model.optim.sched.decay_samples={consumed} (the samples the run consumes)" in warning


def test_a_ramp_up_run_whose_schedule_ends_with_it_gives_no_warning(tmp_path, capsys):
    """A schedule in samples as long as the run's samples: before, the ramp's smaller iterations read
    as a run longer than its schedule ('the last 2.0 steps run at min_lr')."""
    ramp = BatchRamp.from_config([2, 2, 8], 4, 1)
    assert ramp.samples_for(10) == 32  # four batches of 2, then six of 4
    ramped = ["model.global_batch_size=4", "model.rampup_batch_size=[2,2,8]", "trainer.max_steps=10"]
    assert main(train_args(tmp_path, *ramped, "model.optim.sched.decay_samples=32")) == 0
    out = capsys.readouterr().out
    assert "iteration       10/      10" in out and "warning: the decay" not in out
    # the same run with its schedule 16 samples short is warned of: the last 4 iterations at min_lr
    assert main(train_args(tmp_path / "short", *ramped, "model.optim.sched.decay_samples=16")) == 0
    assert "so the last 4 steps run at min_lr" in capsys.readouterr().out


def test_a_ramp_up_leaving_the_decay_unfinished_is_said_in_full_batches():
    cfg = load_training_config(
        "gpt3/126m",
        ["trainer.max_steps=20", "model.global_batch_size=8", "model.micro_batch_size=2"]
        + ["model.optim.sched.warmup_steps=1", "model.optim.sched.constant_steps=0"]
        + ["model.rampup_batch_size=[2,2,96]"],
    )
    [warning] = schedule_warnings_of(cfg)
    ramp = BatchRamp.from_config([2, 2, 96], 8, 1)
    assert ramp.samples_for(20) == 48  # 20 iterations of the ramp: 6 full batches of the 20 steps
    assert "the decay ends after the run" in warning and "6 steps of the full batch" in warning
    assert f"the last rate is {lr_at(ramp.samples_for(19) / 8, schedule_spec(cfg)):.3g}" in warning
    assert "set model.optim.sched.decay_samples=48" in warning


def schedule_warnings_of(cfg) -> list[str]:
    from gptrain.train.schedule_checks import run_schedule_warnings

    return run_schedule_warnings(cfg, schedule_spec(cfg))


def test_a_ramp_under_a_schedule_of_the_runs_length_is_told_the_samples_that_end_it():
    """A ramp-up's steps move the schedule by their share of the batch, so a schedule as long as the
    run (sched.max_steps null) ends after it; the advice must not be max_steps=null, which it already
    is. 200 steps of 128 samples, then 800 of 256: 230,400 samples, 900 steps of the full batch."""
    base = ["trainer.max_steps=1000", "model.global_batch_size=256", "model.micro_batch_size=1"]
    base += ["model.rampup_batch_size=[128,128,25600]", "model.optim.sched.warmup_steps=10"]
    base += ["model.optim.sched.constant_steps=0"]
    cfg = load_training_config("gpt3/126m", base)
    assert BatchRamp.from_config([128, 128, 25600], 256, 1).samples_for(1000) == 200 * 128 + 800 * 256
    [after] = schedule_warnings_of(cfg)
    assert after.startswith("the decay ends after the run: model.optim.sched.max_steps=null")
    assert "900 steps of the full batch" in after
    assert after.endswith(
        "set model.optim.sched.decay_samples=230400 (the samples the run consumes) to follow the run"
    )
    followed = load_training_config("gpt3/126m", [*base, "model.optim.sched.decay_samples=230400"])
    assert schedule_warnings_of(followed) == []


def test_a_decay_in_samples_is_named_by_its_key_with_advice_that_works(tmp_path, capsys):
    """A schedule given in samples (decay_samples, as `gptrain megatron` writes --lr-decay-samples) is
    named by that key with its steps, and the advice, followed, ends the decay with the run."""
    overrides = ["trainer.max_steps=10", "model.optim.sched.decay_samples=8"]
    assert main(train_args(tmp_path, *overrides)) == 0
    assert (
        "warning: the decay ends long before the run: model.optim.sched.decay_samples=8 (a schedule of 4"
        " steps) < trainer.max_steps=10, so the last 6 steps run at min_lr=6e-05; set"
        " model.optim.sched.decay_samples=20 (the samples the run consumes) to follow the run\n"
    ) in capsys.readouterr().out
    followed = load_training_config("gpt3/126m", [*TINY, *overrides, "model.optim.sched.decay_samples=20"])
    assert schedule_warnings_of(followed) == []


def test_a_warmup_in_samples_or_a_ratio_is_named_by_its_key():
    """Before, a warmup of 51200 samples at batch 256 was 'model.optim.sched.warmup_steps=200', a key
    the config does not set, and the advice was to lower warmup_steps, which changed nothing."""
    cfg = load_training_config(
        "gpt3/126m",
        [
            "trainer.max_steps=100",
            "model.optim.sched.warmup_steps=0",
            "model.optim.sched.warmup_samples=51200",
        ],
    )
    [warning] = schedule_warnings_of(cfg)
    assert warning.startswith(
        "model.optim.sched.warmup_samples=51200 (200 steps) is not shorter than trainer.max_steps=100:"
    )
    assert warning.endswith("lower model.optim.sched.warmup_samples or raise trainer.max_steps")
    ratio = ["model.optim.sched.warmup_steps=null", "model.optim.sched.warmup_ratio=0.7"]
    cfg = load_training_config(
        "gpt3/126m", ["trainer.max_steps=1000", *ratio, "model.optim.sched.constant_steps=400"]
    )
    [warning] = schedule_warnings_of(cfg)
    assert warning.startswith(
        "model.optim.sched.warmup_ratio=0.7 (700 steps) + model.optim.sched.constant_steps=400 leaves no decay in"
        " model.optim.sched.max_steps=null (a schedule of trainer.max_steps, 1000 steps):"
    )


def test_a_constant_phase_set_by_a_ratio_is_named_by_its_key():
    """Before, NeMo's constant_ratio=0.5 was named model.optim.sched.constant_steps (its 500 steps), a
    key the config leaves null."""
    sched = ["model.optim.sched.warmup_steps=600", "model.optim.sched.constant_steps=null"]
    cfg = load_training_config(
        "gpt3/126m", ["trainer.max_steps=1000", *sched, "model.optim.sched.constant_ratio=0.5"]
    )
    [warning] = schedule_warnings_of(cfg)
    assert warning.startswith(
        "model.optim.sched.warmup_steps=600 + model.optim.sched.constant_ratio=0.5 (500 steps) leaves no decay"
    )


def test_the_readmes_first_training_example_has_no_schedule_warning():
    """README's `gptrain train gpt3/126m trainer.max_steps=1000 ...` warned that the rate drops to
    min_lr at once after warmup (the preset's 100,000 constant steps leave no decay in 1,000)."""
    import shlex
    from pathlib import Path

    from gptrain.train.schedule_checks import run_schedule_warnings

    text = (Path(__file__).parents[2] / "README.md").read_text()
    command = next(c for c in text.replace("\\\n", " ").splitlines() if c.startswith("gptrain train "))
    overrides = shlex.split(command)[3:]
    assert "trainer.max_steps=1000" in overrides
    cfg = load_training_config("gpt3/126m", overrides, report_ignored=False)
    assert run_schedule_warnings(cfg, schedule_spec(cfg)) == []
    assert schedule_spec(cfg).warmup_steps < cfg.trainer.max_steps  # the rate reaches lr, then decays
