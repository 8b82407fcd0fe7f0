"""Megatron's --lr-decay-style inverse-square-root and WSD: every iteration's rate, reached from the
flags, against Megatron's OptimizerParamScheduler.get_lr restated here in float64 (in samples, as
Megatron counts it).

Tolerance: both sides are a few float64 operations on the same inputs; gptrain counts in steps of
the full batch (a length in samples divided by the batch, a ramp's step the samples so far over the
batch), so a ratio differs by a few ulp (~1e-16 relative) at most, which the decays (cosine, 0.5 ** r, sqrt)
carry at most ~pi-fold, and the rates in units of lr stay within 1e-13 relative of lr."""

import math
import shlex

import pytest

from gptrain.config import load_training_config
from gptrain.errors import ConfigError
from gptrain.megatron.translate import translate
from gptrain.train.rampup import BatchRamp
from gptrain.train.schedule import LRSchedule, ScheduleSpec, lr_at, spec_from_config

BASE = (
    "--num-layers 2 --hidden-size 8 --num-attention-heads 2 --seq-length 16 --micro-batch-size 1"
    " --mock-data --vocab-size 64"
)


def megatron_lr(num_steps, *, lr, min_lr, init_lr, warmup, decay, style, wsd_decay=None, wsd_style=None):
    """OptimizerParamScheduler.get_lr (Megatron-LM core), every length in samples."""
    if warmup > 0 and num_steps <= warmup:
        return init_lr + (lr - init_lr) * float(num_steps) / float(warmup)
    if num_steps > decay:
        return min_lr
    if style == "inverse-square-root":
        return max(min_lr, lr * max(warmup, 1) ** 0.5 / max(num_steps, 1) ** 0.5)
    start = decay - wsd_decay
    if num_steps <= start:
        coeff = 1.0
    else:
        r = float(num_steps - start) / float(wsd_decay)
        coeff = {
            "linear": 1.0 - r,
            "cosine": 0.5 * (math.cos(math.pi * r) + 1.0),
            "exponential": 2.0 * math.pow(0.5, r) - 1.0,
            "minus_sqrt": 1.0 - math.sqrt(r),
        }[wsd_style]
    return min_lr + coeff * (lr - min_lr)


def spec_of(flags):
    cfg = load_training_config(
        None, translate(shlex.split(f"{BASE} {flags}"), {}).overrides, report_ignored=False
    )
    return cfg, spec_from_config(cfg)


def assert_megatrons(cfg, spec, lr, expected_at):
    """The rate of every iteration the run trains (and the schedule past it) is Megatron's at the samples
    consumed before it, driven as the loop drives the schedule (each step its share of the full batch)."""
    ramp = BatchRamp.from_config(cfg.model.rampup_batch_size, cfg.model.global_batch_size, 1)
    schedule, consumed = LRSchedule(optimizer=None, spec=spec), 0
    for iteration in range(cfg.trainer.max_steps + 5):
        expected = expected_at(consumed)
        assert schedule.current_lr() == pytest.approx(expected, rel=1e-13, abs=1e-13 * lr), (
            iteration,
            consumed,
        )
        batch = ramp.at(consumed)
        schedule.advance(batch / cfg.model.global_batch_size)
        consumed += batch


WSD_CASES = [  # (run and decay flags, warmup flags, annealing flags, batch)
    ("--train-iters 60", "--lr-warmup-iters 6", "--lr-wsd-decay-iters 20", 4),
    ("--train-iters 60", "", "--lr-wsd-decay-iters 20", 8),  # no warmup
    (
        "--train-iters 60 --lr-decay-iters 80",
        "--lr-warmup-iters 5",
        "--lr-wsd-decay-iters 30",
        2,
    ),  # past the run
    (
        "--train-iters 60 --lr-decay-iters 40",
        "--lr-warmup-iters 5",
        "--lr-wsd-decay-iters 10",
        2,
    ),  # ends before
    (
        "--train-iters 30",
        "--lr-warmup-iters 10",
        "--lr-wsd-decay-iters 25",
        3,
    ),  # annealing from within warmup
    ("--train-iters 30", "--lr-warmup-fraction 0.15", "--lr-wsd-decay-iters 0", 4),  # no annealing: a cliff
    ("--train-iters 30", "--lr-warmup-iters 3 --lr-warmup-init 1e-5", "--lr-wsd-decay-iters 7", 4),
    ("--train-samples 600", "--lr-warmup-samples 50", "--lr-wsd-decay-samples 170", 8),
    (
        "--train-samples 600 --lr-decay-samples 500",
        "--lr-warmup-fraction 0.1",
        "--lr-wsd-decay-samples 99",
        7,
    ),
    (
        "--train-samples 600 --rampup-batch-size 2 2 100",
        "--lr-warmup-samples 30",
        "--lr-wsd-decay-samples 150",
        8,
    ),
    (  # the ramp reaches the warmup's end (65 samples) exactly: a sum of fractions was past it by float error
        "--train-samples 400 --lr-decay-samples 194 --rampup-batch-size 1 1 102",
        "--lr-warmup-samples 65",
        "--lr-wsd-decay-samples 164",
        3,
    ),
]


@pytest.mark.parametrize("style", ["linear", "cosine", "exponential", "minus_sqrt", None])
@pytest.mark.parametrize("run, warmup, anneal, batch", WSD_CASES)
def test_wsd_is_megatrons_at_every_iteration(style, run, warmup, anneal, batch):
    given_style = "" if style is None else f"--lr-wsd-decay-style {style}"
    flags = f"--global-batch-size {batch} --lr 3e-4 --min-lr 3e-5 --lr-decay-style WSD {run} {warmup} {anneal} {given_style}"
    cfg, spec = spec_of(flags)
    assert spec.name == "WarmupStableDecay"
    assert_megatrons(cfg, spec, 3e-4, lambda consumed: megatron_lr(consumed, **megatron_args(flags, batch)))


ISR_CASES = [
    ("--train-iters 50", "--lr-warmup-iters 8", 4),
    ("--train-iters 50", "", 16),  # no warmup: Megatron's max(., 1) sample
    ("--train-iters 50 --lr-decay-iters 30", "--lr-warmup-iters 3", 2),  # min_lr past the decay
    ("--train-iters 50", "--lr-warmup-fraction 0.2 --lr-warmup-init 1e-6", 4),
    ("--train-samples 400", "--lr-warmup-samples 40", 8),
    ("--train-samples 400", "", 8),
    ("--train-samples 400 --lr-decay-samples 250", "--lr-warmup-samples 21", 5),
    ("--train-samples 400 --rampup-batch-size 2 2 120", "--lr-warmup-samples 33", 8),
    # the ramp reaches the decay's end (253 samples) exactly: min_lr only after it, as Megatron's whole samples
    ("--train-samples 400 --lr-decay-samples 253 --rampup-batch-size 1 1 146", "--lr-warmup-samples 84", 5),
]


@pytest.mark.parametrize("min_lr", [0.0, 1e-5, 6e-4])  # 6e-4: lr x sqrt(warmup / samples) falls below it
@pytest.mark.parametrize("run, warmup, batch", ISR_CASES)
def test_inverse_square_root_is_megatrons_at_every_iteration(min_lr, run, warmup, batch):
    flags = f"--global-batch-size {batch} --lr 1e-3 --min-lr {min_lr} --lr-decay-style inverse-square-root {run} {warmup}"
    cfg, spec = spec_of(flags)
    assert spec.name == "MegatronInverseSquareRoot"
    assert_megatrons(cfg, spec, 1e-3, lambda consumed: megatron_lr(consumed, **megatron_args(flags, batch)))


def test_inverse_square_root_stops_at_min_lr_before_the_decays_end():
    """Megatron's max(min_lr, .): lr x sqrt(8 / 32) = lr / 2 at step 32, below a min_lr of 0.6 lr, so the rate
    is min_lr from the step where lr x sqrt(8 / step) first is (23: sqrt(8 / 23) = 0.5898 < 0.6)."""
    spec = ScheduleSpec(
        name="MegatronInverseSquareRoot",
        lr=1.0,
        min_lr=0.6,
        max_steps=100,
        warmup_steps=8,
        global_batch_size=1,
    )
    assert lr_at(22, spec) == pytest.approx((8 / 22) ** 0.5, rel=1e-15) and (8 / 22) ** 0.5 > 0.6
    assert [lr_at(step, spec) for step in (23, 32, 100)] == [0.6, 0.6, 0.6]


def megatron_args(flags, batch):
    """get_optimizer_param_scheduler's lengths in samples, from the flags as Megatron reads them."""
    words = shlex.split(flags)

    def value(flag, kind=int, default=None):
        return kind(words[words.index(flag) + 1]) if flag in words else default

    if "--train-iters" in words:
        decay = value("--lr-decay-iters", default=value("--train-iters")) * batch
        wsd = value("--lr-wsd-decay-iters")
        wsd = None if wsd is None else wsd * batch
        warmup = value("--lr-warmup-iters", default=0) * batch
    else:
        decay = value("--lr-decay-samples", default=value("--train-samples"))
        wsd = value("--lr-wsd-decay-samples")
        warmup = value("--lr-warmup-samples", default=0)
    fraction = value("--lr-warmup-fraction", float)
    return {
        "lr": value("--lr", float),
        "min_lr": value("--min-lr", float),
        "init_lr": value("--lr-warmup-init", float, 0.0),
        "warmup": warmup if fraction is None else fraction * decay,
        "decay": decay,
        "style": value("--lr-decay-style", str),
        "wsd_decay": wsd,
        "wsd_style": value("--lr-wsd-decay-style", str, "exponential"),
    }


def test_a_resume_in_the_middle_goes_on_with_the_same_rates():
    """The schedule's state is its step: a checkpoint's state_dict loaded into the schedule a fresh
    start builds from the same flags gives the uninterrupted run's rates from there on."""
    flags = "--global-batch-size 4 --train-iters 40 --lr-decay-style WSD --lr-wsd-decay-iters 15 --lr-warmup-iters 4"
    for style_flags in (flags, flags.replace("WSD --lr-wsd-decay-iters 15", "inverse-square-root")):
        _, spec = spec_of(style_flags)
        whole = LRSchedule(None, spec)
        rates = []
        for _ in range(40):
            rates.append(whole.current_lr())
            whole.advance()
        first = LRSchedule(None, spec)
        for _ in range(29):
            first.advance()
        resumed = LRSchedule(None, spec_of(style_flags)[1])
        assert resumed.load_state_dict(first.state_dict()) is None
        assert [lr_at(resumed.step + k, resumed.spec) for k in range(11)] == rates[29:]
        assert resumed.state_dict() == first.state_dict()


def test_wsd_config_keys_are_checked_by_name():
    def spec(**kwargs):
        return ScheduleSpec(
            **{"name": "WarmupStableDecay", "lr": 1.0, "min_lr": 0.0, "max_steps": 10} | kwargs
        )

    with pytest.raises(
        ConfigError, match="wsd_decay_steps: WarmupStableDecay needs the length of its annealing"
    ):
        spec()
    with pytest.raises(
        ConfigError, match="wsd_decay_style='square' is not supported; use one of linear, cosine"
    ):
        spec(wsd_decay_steps=3, wsd_decay_style="square")
    with pytest.raises(ConfigError, match="wsd_decay_steps=3: only WarmupStableDecay"):
        spec(name="CosineAnnealing", wsd_decay_steps=3)
    with pytest.raises(ConfigError, match="wsd_decay_steps=0: only WarmupStableDecay"):  # a 0 is given too
        spec(name="CosineAnnealing", wsd_decay_steps=0)
    with pytest.raises(ConfigError, match="constant_steps=2: WarmupStableDecay has no constant phase"):
        spec(wsd_decay_steps=3, constant_steps=2)
    assert [lr_at(s, spec(wsd_decay_steps=4, wsd_decay_style="linear")) for s in (0, 6, 7, 8, 10, 11)] == [
        1.0,
        1.0,
        0.75,
        0.5,
        0.0,
        0.0,
    ]


def test_wsd_config_in_samples_and_the_default_style(tmp_path):
    overrides = [
        "model.optim.sched.name=WarmupStableDecay",
        "model.optim.sched.decay_samples=4000",
        "model.optim.sched.wsd_decay_samples=1000",
        "model.global_batch_size=8",
        "model.micro_batch_size=1",
        "trainer.max_steps=500",
        "model.optim.sched.constant_steps=0",
    ]
    cfg = load_training_config("gpt3/126m", overrides, report_ignored=False)
    spec = spec_from_config(cfg)
    assert (spec.max_steps, spec.wsd_decay_steps, spec.wsd_decay_style, spec.counts_samples) == (
        500,
        125,
        "exponential",
        True,
    )
    both = [*overrides, "model.optim.sched.wsd_decay_steps=10"]
    with pytest.raises(
        ConfigError, match="wsd_decay_steps=10 and model.optim.sched.wsd_decay_samples=1000: give only one"
    ):
        spec_from_config(load_training_config("gpt3/126m", both, report_ignored=False))
    other = [*overrides[1:], "model.optim.sched.name=CosineAnnealing"]
    with pytest.raises(ConfigError, match="wsd_decay_samples=1000: only WarmupStableDecay"):
        spec_from_config(load_training_config("gpt3/126m", other, report_ignored=False))


def test_megatrons_quirks_are_start_warnings_named_by_the_flags():
    """Kept as Megatron computes them, and said: an inverse square root without a warmup falls by
    sqrt(first batch) after the first step (a ramp-up's, else the global batch); a WSD annealing longer
    than the decay after the warmup makes the rate step down when the warmup ends."""
    from gptrain.train.schedule_checks import run_schedule_warnings

    def warnings(flags):
        translation = translate(shlex.split(f"{BASE} {flags}"), {})
        cfg = load_training_config(None, translation.overrides, report_ignored=False)
        spec = spec_from_config(cfg)
        return run_schedule_warnings(cfg, spec, translation.schedule_names(cfg, spec))

    isr = "--global-batch-size 16 --lr 1e-3 --train-iters 50 --lr-decay-style inverse-square-root"
    assert warnings(isr) == [
        "--lr-warmup-iters 0: Megatron's inverse square root without a warmup is lr / sqrt(samples consumed),"
        " so the rate falls from 0.001 to 0.00025 (/ sqrt(16), the global batch) after the first step; give a"
        " warmup (--lr-warmup-iters) for a gradual decay"
    ]
    assert warnings(f"{isr} --lr-warmup-iters 2") == []
    in_samples = "--global-batch-size 4 --lr 1e-3 --train-samples 400 --lr-decay-style inverse-square-root"
    assert warnings(in_samples) == [  # the warmup in samples is the flag beside --train-samples
        "--lr-warmup-samples 0 (0 iterations): Megatron's inverse square root without a warmup is lr /"
        " sqrt(samples consumed), so the rate falls from 0.001 to 0.0005 (/ sqrt(4), the global batch) after"
        " the first step; give a warmup (--lr-warmup-samples) for a gradual decay"
    ]
    assert warnings(f"{in_samples} --rampup-batch-size 2 2 64") == [  # the first step is the ramp's 2 samples
        "--lr-warmup-samples 0 (0 iterations): Megatron's inverse square root without a warmup is lr /"
        " sqrt(samples consumed), so the rate falls from 0.001 to 0.000707 (/ sqrt(2), the ramp-up's first"
        " batch) after the first step; give a warmup (--lr-warmup-samples) for a gradual decay"
    ]
    assert warnings(f"{in_samples} --rampup-batch-size 1 1 64") == []  # 1 sample, then lr / sqrt(2): gradual
    cfg = load_training_config(
        None, translate(shlex.split(f"{BASE} {in_samples}"), {}).overrides, report_ignored=False
    )
    [in_config] = run_schedule_warnings(cfg, spec_from_config(cfg))  # named by the config's keys
    assert in_config.endswith("give a warmup (model.optim.sched.warmup_samples) for a gradual decay"), (
        in_config
    )
    wsd = "--global-batch-size 4 --lr 1e-3 --train-samples 400 --lr-decay-style WSD --lr-warmup-samples 40"
    assert warnings(f"{wsd} --lr-wsd-decay-samples 360") == []
    [longer] = warnings(
        f"{wsd} --lr-wsd-decay-samples 380 --lr-wsd-decay-style linear"
    )  # starts at 5, 1 - 6 / 95
    assert longer == (
        "--lr-wsd-decay-samples 380 (95 iterations) is longer than the decay over --train-samples 400"
        " (100 iterations) after --lr-warmup-samples 40 (10 iterations): the annealing starts within the"
        " warmup, so the rate steps down from 0.001 to 0.000937 when the warmup ends, as in Megatron; give a"
        " shorter annealing"
    )


def test_a_changed_wsd_annealing_is_named_at_the_resume_and_samples_compare_in_samples():
    from gptrain.train.schedule_checks import resumed_schedule_change

    def config(*overrides):
        base = [
            "model.optim.sched.name=WarmupStableDecay",
            "model.optim.sched.constant_steps=0",
            "trainer.max_steps=100",
        ]
        return load_training_config("gpt3/126m", [*base, *overrides], report_ignored=False)

    def resumed(saved_cfg, cfg, steps):
        saved = LRSchedule(None, spec_from_config(saved_cfg))
        saved.step = steps
        schedule = LRSchedule(None, spec_from_config(cfg))
        schedule.load_state_dict(saved.state_dict())
        return schedule

    before = config("model.optim.sched.wsd_decay_steps=15")
    after = config("model.optim.sched.wsd_decay_steps=20", "model.optim.sched.wsd_decay_style=cosine")
    assert resumed_schedule_change(before, resumed(before, before, 90), 91) is None
    line = resumed_schedule_change(after, resumed(before, after, 90), 91)
    assert line is not None
    assert (
        "model.optim.sched.wsd_decay_style exponential -> cosine, model.optim.sched.wsd_decay_steps 15 -> 20;"
        in line
    )
    samples = [
        "model.optim.sched.decay_samples=800",
        "model.optim.sched.wsd_decay_samples=160",
        "model.micro_batch_size=1",
    ]
    saved = config(*samples, "model.global_batch_size=8")
    same = config(*samples, "model.global_batch_size=16")
    assert resumed_schedule_change(same, resumed(saved, same, 60), 31) is None
    longer = config(
        *samples[:1], "model.optim.sched.wsd_decay_samples=240", *samples[2:], "model.global_batch_size=16"
    )
    line = resumed_schedule_change(longer, resumed(saved, longer, 60), 31)
    assert line is not None and "model.optim.sched.wsd_decay_samples 160 -> 240;" in line


def test_a_run_requeued_in_the_annealing_resumes_at_the_uninterrupted_rates(tmp_path, monkeypatch):
    """A tiny run under WSD (linear annealing over the last 4 of 7 iterations) stopped by SIGUSR1 at
    iteration 4 and resumed logs each iteration's rate as the run that was not stopped, Megatron's."""
    from train_e2e_helpers import MOCK, log_lines, run_recording, tiny_config

    from gptrain.errors import EXIT_REQUEUE

    shape = [
        *MOCK,
        "exp_manager.resume_if_exists=true",
        "trainer.max_steps=7",
        "trainer.log_every_n_steps=1",
        "trainer.limit_val_batches=0",
        "trainer.limit_test_batches=0",
        "model.num_layers=1",
        "model.hidden_size=16",
        "model.num_attention_heads=2",
        "model.encoder_seq_length=8",
        "model.optim.lr=1e-3",
        "model.optim.sched.min_lr=1e-4",
        "model.optim.sched.name=WarmupStableDecay",
        "model.optim.sched.warmup_steps=1",
        "model.optim.sched.constant_steps=0",
        "model.optim.sched.wsd_decay_steps=4",
        "model.optim.sched.wsd_decay_style=linear",
    ]

    def rates(run):
        return [
            float(line.split("learning rate: ")[1].split(" ")[0])
            for line in log_lines(run)
            if "learning rate: " in line
        ]

    whole, stopped = tmp_path / "whole", tmp_path / "stopped"
    assert run_recording(monkeypatch, tiny_config(whole, *shape))[0] == 0
    assert run_recording(monkeypatch, tiny_config(stopped, *shape), signal_at=4)[0] == EXIT_REQUEUE
    assert run_recording(monkeypatch, tiny_config(stopped, *shape))[0] == 0
    batch = tiny_config(whole, *shape).model.global_batch_size
    args = {"lr": 1e-3, "min_lr": 1e-4, "init_lr": 0.0, "warmup": batch, "decay": 7 * batch, "style": "WSD"}
    # iteration i logs the rate Megatron's scheduler holds after it, that of the samples of i iterations
    expected = [megatron_lr(i * batch, **args, wsd_decay=4 * batch, wsd_style="linear") for i in range(1, 8)]
    assert rates(whole) == pytest.approx(expected, rel=1e-6)  # the log line's 7 digits
    assert rates(stopped) == rates(whole)


def test_a_wsd_checkpoint_resumed_under_another_schedule_names_the_change(tmp_path, monkeypatch):
    """A checkpoint records WSD's annealing (a setting only WSD has); a resume under CosineAnnealing loads
    that record too, so its line names the changed schedule (it loaded only the keys the new schedule has,
    rebuilt no schedule from them and said nothing)."""
    from train_e2e_helpers import MOCK, log_lines, run_recording, tiny_config

    from gptrain.errors import EXIT_REQUEUE

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
        "model.optim.sched.min_lr=0",
        "model.optim.sched.constant_steps=0",
    ]
    wsd = ["model.optim.sched.name=WarmupStableDecay", "model.optim.sched.wsd_decay_steps=3"]
    run = tmp_path / "run"
    assert run_recording(monkeypatch, tiny_config(run, *shape, *wsd), signal_at=2)[0] == EXIT_REQUEUE
    assert (
        run_recording(monkeypatch, tiny_config(run, *shape, "model.optim.sched.name=CosineAnnealing"))[0] == 0
    )
    [line] = [line for line in log_lines(run) if line.startswith("learning-rate schedule changed")]
    assert line.startswith(
        "learning-rate schedule changed since the checkpoint (this run's config applies): model.optim.sched.name"
        " WarmupStableDecay -> CosineAnnealing, model.optim.sched.wsd_decay_style exponential -> null,"
        " model.optim.sched.wsd_decay_steps 3 -> null; learning rate of iteration 3:"
    ), line


def test_a_resume_under_gptrain_megatron_names_the_changed_wsd_flags():
    """The line at a resume names each changed setting by the flag that set it, WSD's too."""
    from gptrain.train.schedule_checks import resumed_schedule_change

    def resumed(before_flags, after_flags):
        cfg_before, spec_before = spec_of(before_flags)
        saved = LRSchedule(None, spec_before)
        saved.step = 30
        translation = translate(shlex.split(f"{BASE} {after_flags}"), {})
        cfg = load_training_config(None, translation.overrides, report_ignored=False)
        schedule = LRSchedule(None, spec_from_config(cfg))
        schedule.load_state_dict(saved.state_dict())
        return resumed_schedule_change(cfg, schedule, 31, translation.schedule_names(cfg, schedule.spec))

    flags = "--global-batch-size 4 --train-iters 40 --lr-decay-style WSD --lr-wsd-decay-iters 15"
    line = resumed(flags, f"{flags.replace('15', '20')} --lr-wsd-decay-style cosine")
    assert line is not None
    assert (
        "changed since the checkpoint (this run's config applies): --lr-wsd-decay-style exponential -> cosine,"
        in line
    )
    assert "--lr-wsd-decay-iters 15 -> 20;" in line
    line = resumed(flags, flags.replace("WSD --lr-wsd-decay-iters 15", "inverse-square-root"))
    assert line is not None and "--lr-decay-style WSD -> inverse-square-root" in line
