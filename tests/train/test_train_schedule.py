import math
import shlex
from pathlib import Path

import pytest

from gptrain.errors import ConfigError
from gptrain.train.schedule import LRSchedule, ScheduleSpec, lr_at


def cosine_reference(step, lr, min_lr, warmup, constant, max_steps):
    """NeMo's CosineAnnealing with constant_steps, written from its definition."""
    decay = max_steps - warmup - constant
    if step <= warmup:
        return lr * step / warmup
    if step > warmup + decay:
        return min_lr
    return min_lr + 0.5 * (1 + math.cos(math.pi * (step - warmup) / decay)) * (lr - min_lr)


def test_cosine_warmup_decay_constant_against_closed_form():
    spec = ScheduleSpec(
        "CosineAnnealing", lr=6e-4, min_lr=6e-5, max_steps=100, warmup_steps=10, constant_steps=20
    )
    for step in range(0, 130):
        assert lr_at(step, spec) == pytest.approx(cosine_reference(step, 6e-4, 6e-5, 10, 20, 100), rel=1e-12)
    assert lr_at(0, spec) == 0.0
    assert lr_at(5, spec) == pytest.approx(3e-4)
    assert lr_at(10, spec) == pytest.approx(6e-4)
    assert lr_at(45, spec) == pytest.approx((6e-4 + 6e-5) / 2)  # half way through the 70 decay steps
    assert lr_at(80, spec) == pytest.approx(6e-5)
    assert lr_at(95, spec) == 6e-5


def test_linear_and_constant():
    linear = ScheduleSpec("LinearAnnealing", lr=1.0, min_lr=0.0, max_steps=12, warmup_steps=2)
    assert [lr_at(s, linear) for s in (0, 1, 2, 7, 12, 20)] == pytest.approx([0, 0.5, 1.0, 0.5, 0.0, 0.0])
    constant = ScheduleSpec("Constant", lr=0.3, min_lr=0.0, max_steps=5)
    assert lr_at(0, constant) == lr_at(100, constant) == 0.3
    # Megatron's 'constant' decay style warms up first (--lr-warmup-iters 10)
    warmed = ScheduleSpec("Constant", lr=1e-3, min_lr=0.0, max_steps=50, warmup_steps=10)
    assert [lr_at(s, warmed) for s in (0, 1, 5, 10, 11, 49)] == pytest.approx(
        [0, 1e-4, 5e-4, 1e-3, 1e-3, 1e-3]
    )


def test_no_warmup_starts_at_peak():
    spec = ScheduleSpec("CosineAnnealing", lr=2.0, min_lr=1.0, max_steps=4)
    assert [lr_at(s, spec) for s in range(5)] == pytest.approx(
        [2.0, 1.5 + 0.5 * math.cos(math.pi / 4), 1.5, 1.5 - 0.5 * math.cos(math.pi / 4), 1.0]
    )


def test_holder_sets_groups_and_round_trips_state():
    class FakeOptimizer:
        param_groups = [{"lr": None}, {"lr": None}]

    spec = ScheduleSpec("LinearAnnealing", lr=1.0, min_lr=0.0, max_steps=4)
    schedule = LRSchedule(FakeOptimizer(), spec)
    schedule.advance()
    assert schedule.apply() == 0.75
    assert [g["lr"] for g in schedule.optimizer.param_groups] == [0.75, 0.75]
    other = LRSchedule(FakeOptimizer(), spec)
    other.load_state_dict(schedule.state_dict())
    assert other.current_lr() == 0.75


@pytest.mark.parametrize(
    "kwargs, key",
    [({"name": "Noam"}, "sched.name"), ({"min_lr": 2.0}, "min_lr"), ({"warmup_steps": -1}, "warmup_steps")],
)
def test_bad_schedules_name_the_key(kwargs, key):
    args = {"name": "CosineAnnealing", "lr": 1.0, "min_lr": 0.0, "max_steps": 10} | kwargs
    with pytest.raises(ConfigError, match=key):
        ScheduleSpec(**args)


def test_nemo_warmup_ratio_warms_up_over_int_ratio_times_the_schedule():
    from gptrain.config import load_training_config
    from gptrain.train.schedule import spec_from_config

    overrides = ["trainer.max_steps=95", "model.optim.lr=1e-3", "model.optim.sched.min_lr=1e-4"]
    overrides += ["model.optim.sched.warmup_steps=0", "model.optim.sched.warmup_ratio=0.1"]
    spec = spec_from_config(load_training_config("gpt3/126m", overrides, report_ignored=False))
    assert spec.warmup_steps == 9  # int(0.1 x 95), as NeMo rounds it
    assert [lr_at(step, spec) for step in (3, 9)] == pytest.approx([1e-3 / 3, 1e-3])
    assert lr_at(10, spec) < 1e-3  # decaying after the warmup
    both = load_training_config("gpt3/126m", ["model.optim.sched.warmup_ratio=0.1"], report_ignored=False)
    with pytest.raises(ConfigError, match="model.optim.sched.warmup_steps, model.optim.sched.warmup_ratio"):
        spec_from_config(both)  # the preset's warmup_steps and a ratio: NeMo refuses both too


def nemo_cosine_annealing(
    step, lr, min_lr, warmup, constant, max_steps, *, warmup_ratio=None, constant_ratio=None
):
    """NeMo's CosineAnnealing (nemo/core/optim/lr_scheduler.py) at `last_epoch` = step, in float64.

    Written from its branches, in their order. WarmupAnnealHoldPolicy.__init__ resolves a None
    warmup / constant to int(ratio x max_steps) when the ratio is given, else to 0 (and refuses
    both). get_lr picks warmup, the final constant phase (only if constant > 0), min_lr past
    max_steps, or the decay; CosineAnnealing warms up as WarmupAnnealHoldPolicy (step + 1) /
    (warmup + 1) and decays over max_steps - warmup when constant is 0 (or None), and as
    _linear_warmup_with_cosine_annealing (step / warmup, decay over max_steps - warmup - constant,
    then min_lr) when constant > 0.
    """
    assert not (warmup is not None and warmup_ratio is not None)
    assert not (constant is not None and constant_ratio is not None)
    if warmup is None:
        warmup = int(warmup_ratio * max_steps) if warmup_ratio is not None else 0
    if constant is None:
        constant = int(constant_ratio * max_steps) if constant_ratio is not None else 0
    decay = max_steps - (constant + warmup)  # NeMo does not clamp it
    if warmup > 0 and step <= warmup:
        return lr * (step + 1) / (warmup + 1) if constant == 0 else lr * step / warmup
    if constant > 0 and warmup + decay < step <= max_steps:
        return min_lr
    if step > max_steps:
        return min_lr
    if constant == 0:
        ratio = (step - warmup) / (max_steps - warmup)
    elif step > warmup + decay:
        return min_lr
    else:
        ratio = (step - warmup) / decay
    return min_lr + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (lr - min_lr)


NEMO_CASES = [
    (warmup, constant, min_lr, max_steps)
    for warmup in (0, 4)
    for constant in (0, 3)
    for min_lr in (0.0, 1e-4)
    for max_steps in (10, 17)
] + [
    (6, 4, 1e-4, 10),  # warmup + constant = max_steps: no decay
    (8, 5, 1e-4, 10),  # warmup + constant > max_steps: NeMo's decay_steps is negative
    (12, 0, 1e-4, 10),  # warmup longer than the schedule, NeMo's warmup
    (12, 3, 0.0, 10),  # the same, Megatron's warmup
    (1, 0, 0.0, 2),
]


@pytest.mark.parametrize("warmup, constant, min_lr, max_steps", NEMO_CASES)
def test_cosine_annealing_is_nemos_at_every_step(warmup, constant, min_lr, max_steps):
    spec = ScheduleSpec("CosineAnnealing", 1e-3, min_lr, max_steps, warmup, constant)
    for step in range(max_steps + 4):
        expected = nemo_cosine_annealing(step, 1e-3, min_lr, warmup, constant, max_steps)
        assert lr_at(step, spec) == pytest.approx(expected, rel=1e-12, abs=1e-18), step


def test_nemo_warmup_without_constant_steps_starts_above_zero():
    """constant_steps 0 (the _improved presets): the first step runs at lr / (warmup + 1)."""
    spec = ScheduleSpec("CosineAnnealing", lr=1.0, min_lr=0.0, max_steps=10, warmup_steps=4)
    assert [lr_at(s, spec) for s in (0, 1, 3, 4)] == pytest.approx([0.2, 0.4, 0.8, 1.0])
    assert lr_at(5, spec) == pytest.approx(0.5 * (1 + math.cos(math.pi / 6)))
    assert lr_at(10, spec) == 0.0
    held = ScheduleSpec("CosineAnnealing", 1.0, 0.0, 10, warmup_steps=4, constant_steps=3)
    assert [lr_at(s, held) for s in (0, 1, 4)] == pytest.approx([0.0, 0.25, 1.0])  # Megatron's


def test_schedule_follows_nemos_step_count():
    """NeMo's scheduler starts at last_epoch 0 (the first iteration's rate) and steps after each
    optimizer step; the rate read after a step (Megatron's printed one) is the next iteration's."""

    class FakeOptimizer:
        param_groups = [{"lr": None}]

    spec = ScheduleSpec("CosineAnnealing", lr=1e-3, min_lr=1e-4, max_steps=12, warmup_steps=3)
    schedule = LRSchedule(FakeOptimizer(), spec)
    for iteration in range(1, 13):
        used = schedule.apply()
        assert used == pytest.approx(nemo_cosine_annealing(iteration - 1, 1e-3, 1e-4, 3, 0, 12), rel=1e-12)
        schedule.advance()
        assert schedule.current_lr() == pytest.approx(nemo_cosine_annealing(iteration, 1e-3, 1e-4, 3, 0, 12))
    assert schedule.current_lr() == 1e-4  # at max_steps, after the last iteration


def test_nemo_config_warms_up_as_nemo_and_megatron_flags_as_megatron():
    from gptrain.config import load_training_config
    from gptrain.megatron.translate import translate
    from gptrain.train.schedule import spec_from_config

    overrides = ["trainer.max_steps=12", "model.optim.lr=1e-3", "model.optim.sched.min_lr=1e-4"]
    overrides += ["model.optim.sched.warmup_steps=4", "model.optim.sched.constant_steps=0"]
    nemo = spec_from_config(load_training_config("gpt3/126m", overrides, report_ignored=False))
    assert [lr_at(s, nemo) for s in (0, 4)] == pytest.approx([2e-4, 1e-3])
    flags = (
        "--num-layers 2 --hidden-size 8 --num-attention-heads 2 --seq-length 16 --micro-batch-size 2"
        " --train-iters 12 --mock-data --vocab-size 64 --lr 1e-3 --min-lr 1e-4 --lr-decay-style cosine"
        " --lr-warmup-iters 4"
    )
    cfg = load_training_config(None, translate(shlex.split(flags), {}).overrides, report_ignored=False)
    megatron = spec_from_config(cfg)
    assert megatron.name == "CosineAnnealing" and megatron.constant_steps == 0
    assert [lr_at(s, megatron) for s in (0, 1, 4)] == pytest.approx([0.0, 2.5e-4, 1e-3])
    with pytest.raises(ConfigError, match="model.optim.sched.warmup_style"):
        load_training_config("gpt3/126m", ["model.optim.sched.warmup_style=nemo2"], report_ignored=False)


# (overrides of model.optim.sched, NeMo's scheduler arguments): NeMo configs with a null
# warmup_steps / constant_steps, with or without the ratio that replaces it.
NEMO_NULL_AND_RATIO_CASES = [
    (["constant_steps=null"], {"warmup": 4, "constant": None}),  # null is 0: NeMo's warmup
    (["constant_steps=null", "constant_ratio=0.1"], {"warmup": 4, "constant_ratio": 0.1}),
    (["constant_steps=null", "constant_ratio=0.25"], {"warmup": 4, "constant_ratio": 0.25}),
    # int(0.03 x 30) = 0 constant steps: NeMo's warmup from lr / (warmup + 1), as constant_steps 0
    (["constant_steps=null", "constant_ratio=0.03"], {"warmup": 4, "constant_ratio": 0.03}),
    (
        ["warmup_steps=null", "warmup_ratio=0.1", "constant_steps=null", "constant_ratio=0.2"],
        {"warmup": None, "warmup_ratio": 0.1, "constant": None, "constant_ratio": 0.2},
    ),
    (["warmup_steps=null", "constant_steps=null"], {"warmup": None, "constant": None}),
    # the ratio is of the schedule's length (sched.max_steps), not of the run's
    (["max_steps=20", "constant_steps=null", "constant_ratio=0.15"], {"warmup": 4, "constant_ratio": 0.15}),
]


@pytest.mark.parametrize("sched, nemo", NEMO_NULL_AND_RATIO_CASES)
def test_nemo_null_steps_and_constant_ratio_are_nemos_at_every_step(sched, nemo):
    from gptrain.config import load_training_config
    from gptrain.train.schedule import spec_from_config

    overrides = ["trainer.max_steps=30", "model.optim.lr=1e-3", "model.optim.sched.min_lr=1e-4"]
    overrides += ["model.optim.sched.warmup_steps=4"] + [f"model.optim.sched.{o}" for o in sched]
    spec = spec_from_config(load_training_config("gpt3/126m", overrides, report_ignored=False))
    length = 20 if "max_steps=20" in sched else 30  # NeMo: sched.max_steps, else trainer.max_steps
    args = {"constant": None} | nemo
    warmup, constant = args.pop("warmup"), args.pop("constant")
    for step in range(34):
        expected = nemo_cosine_annealing(step, 1e-3, 1e-4, warmup, constant, length, **args)
        assert lr_at(step, spec) == pytest.approx(expected, rel=1e-12, abs=1e-18), step


def test_nemo_yaml_with_constant_ratio_builds_its_schedule(tmp_path):
    """A NeMo file that replaces constant_steps by a ratio loads unchanged: int(0.1 x 600000)."""
    from gptrain.config import load_training_config
    from gptrain.config.loader import preset_path
    from gptrain.train.schedule import spec_from_config

    text = Path(preset_path("gpt3/126m")).read_text()
    assert "      constant_steps: 100000\n" in text
    nemo = text.replace("constant_steps: 100000\n", "constant_steps: null\n      constant_ratio: 0.1\n")
    path = tmp_path / "126m_ratio.yaml"
    path.write_text(nemo)
    spec = spec_from_config(load_training_config(config_file=str(path), report_ignored=False))
    assert (spec.max_steps, spec.warmup_steps, spec.constant_steps) == (600000, 636, 60000)
    assert lr_at(636 // 2, spec) == pytest.approx(6e-4 * 318 / 636)  # Megatron's warmup: constant > 0
    assert lr_at(600000 - 60000, spec) == 6e-5
    held = load_training_config(
        config_file=str(path), overrides=["model.optim.sched.constant_ratio=null"], report_ignored=False
    )
    assert spec_from_config(held).constant_steps == 0  # both null: 0, as NeMo


def test_constant_steps_and_constant_ratio_together_is_one_line_naming_both():
    from gptrain.config import load_training_config
    from gptrain.train.schedule import spec_from_config

    both = load_training_config("gpt3/126m", ["model.optim.sched.constant_ratio=0.1"], report_ignored=False)
    with pytest.raises(ConfigError) as error:
        spec_from_config(both)  # the preset's constant_steps 100000 and a ratio: NeMo asserts too
    message = str(error.value)
    assert "model.optim.sched.constant_steps=100000" in message
    assert "model.optim.sched.constant_ratio=0.1" in message
    assert "\n" not in message


def test_a_zero_constant_steps_beside_constant_ratio_counts_as_absent(tmp_path):
    """As a 0 warmup_steps beside warmup_ratio: the presets and every hparams.yaml written before
    constant_steps defaulted to null carry `constant_steps: 0`, and a ratio given on top of them must
    load. A non-zero count and a ratio are refused (NeMo's WarmupAnnealHoldPolicy asserts)."""
    from gptrain.config import load_training_config
    from gptrain.train.schedule import spec_from_config

    for preset in ("quickstart/cpu", "gpt3/126m"):
        on_a_zero = load_training_config(
            preset,
            [
                "model.optim.sched.constant_steps=0",
                "model.optim.sched.constant_ratio=0.1",
                "trainer.max_steps=50",
            ],
            report_ignored=False,
        )
        assert spec_from_config(on_a_zero).constant_steps == 5, preset
    both = load_training_config(
        "gpt3/126m",
        ["model.optim.sched.constant_steps=2", "model.optim.sched.constant_ratio=0.1"],
        report_ignored=False,
    )
    with pytest.raises(ConfigError) as error:
        spec_from_config(both)
    assert str(error.value) == (
        "model.optim.sched.constant_steps=2 and model.optim.sched.constant_ratio=0.1: give only one"
        " (constant_steps=null to use the ratio)"
    )
    # a file that gives only the ratio holds int(0.1 x 30) = 3 steps at min_lr
    path = tmp_path / "ratio.yaml"
    path.write_text(
        "trainer: {max_steps: 30}\nmodel:\n  data: {data_impl: mock, mock_vocab_size: 64}\n"
        "  optim: {lr: 1.0e-3, sched: {warmup_steps: 4, constant_ratio: 0.1, min_lr: 1.0e-4}}\n"
    )
    spec = spec_from_config(load_training_config(config_file=str(path), report_ignored=False))
    assert (spec.max_steps, spec.warmup_steps, spec.constant_steps) == (30, 4, 3)


def megatron_cosine_by_samples(samples, lr, min_lr, warmup_samples, decay_samples):
    """Megatron's OptimizerParamScheduler.get_lr with its step counted in samples (--lr-*-samples)."""
    if warmup_samples > 0 and samples <= warmup_samples:
        return lr * samples / warmup_samples
    if samples > decay_samples:
        return min_lr
    ratio = (samples - warmup_samples) / (decay_samples - warmup_samples)
    return min_lr + 0.5 * (math.cos(math.pi * ratio) + 1.0) * (lr - min_lr)


def resumed_with_another_batch(sched: list[str], before: int, after: int, steps: int):
    """(schedule after `steps` at global batch `before`, resumed at global batch `after`; its line)."""
    from gptrain.config import load_training_config
    from gptrain.train.schedule import spec_from_config

    class FakeOptimizer:
        param_groups = [{"lr": None}]

    def spec(batch):
        overrides = ["trainer.max_steps=200", f"model.global_batch_size={batch}", "model.micro_batch_size=4"]
        return spec_from_config(load_training_config("gpt3/126m", [*overrides, *sched]))

    first = LRSchedule(FakeOptimizer(), spec(before))
    for _ in range(steps):
        first.advance()
    resumed = LRSchedule(FakeOptimizer(), spec(after))
    return resumed, resumed.load_state_dict(first.state_dict())


def test_a_schedule_in_samples_resumed_with_another_global_batch_goes_on_from_its_samples():
    """Megatron's scheduler counts samples: after 30 steps of 8 (240 samples) a resume at 16 a step
    goes on at 240, 256, 272... samples; it went on at step 30 of 16, 480 samples into the schedule."""
    sched = [
        "model.optim.lr=1e-3",
        "model.optim.sched.min_lr=1e-4",
        "model.optim.sched.name=CosineAnnealing",
        "model.optim.sched.warmup_steps=0",
        "model.optim.sched.warmup_samples=100",
        "model.optim.sched.decay_samples=1000",
        "model.optim.sched.constant_steps=0",
        "model.optim.sched.warmup_style=megatron",
    ]
    resumed, line = resumed_with_another_batch(sched, before=8, after=16, steps=30)
    for k in range(60):  # to past the decay's end
        expected = megatron_cosine_by_samples(240 + 16 * k, 1e-3, 1e-4, 100, 1000)
        assert resumed.current_lr() == pytest.approx(expected, rel=1e-12, abs=1e-18)
        resumed.advance()
    assert line == (
        "learning-rate schedule: model.global_batch_size=16, the checkpoint's was 8; the schedule counts "
        "samples (model.optim.sched.decay_samples/warmup_samples, as Megatron's --lr-*-samples), so it goes "
        "on from the 240 samples it has seen: step 30 of 8 samples is step 15 of 16"
    )
    same, none = resumed_with_another_batch(sched, before=8, after=8, steps=30)
    assert none is None and same.step == 30 and isinstance(same.step, int)


def test_a_schedule_in_steps_resumed_with_another_global_batch_goes_on_at_its_step_and_says_so():
    """NeMo's scheduler counts optimizer steps, whatever the batch: the resumed rate is the one of
    the step the checkpoint reached."""
    sched = ["model.optim.sched.warmup_steps=10", "model.optim.sched.constant_steps=0"]
    resumed, line = resumed_with_another_batch(sched, before=8, after=16, steps=30)
    assert resumed.step == 30
    assert resumed.current_lr() == pytest.approx(nemo_cosine_annealing(30, 6e-4, 6e-5, 10, 0, 200), rel=1e-12)
    assert line.startswith(
        "learning-rate schedule: model.global_batch_size=16, the checkpoint's was 8; the schedule counts "
        "optimizer steps (NeMo's), so it goes on at step 30, each step now 16 samples"
    )


def test_a_checkpoint_from_before_the_schedules_batch_was_saved_loads_its_step():
    from gptrain.train.state import checkpoint_state

    class FakeOptimizer:
        param_groups = [{"lr": None}]

    schedule = LRSchedule(FakeOptimizer(), ScheduleSpec("Constant", 1.0, 0.0, 10, global_batch_size=8))
    state = schedule.state_dict()
    assert state["step"] == 0 and state["global_batch_size"] == 8
    from gptrain.train.loss_scale import ConstantLossScaler
    from gptrain.train.state import TrainState

    parts, saved = ["schedule"], ["schedule.step"]
    old = checkpoint_state(None, None, schedule, ConstantLossScaler(), TrainState(), parts, saved)
    assert old == {"schedule": {"step": 0}}
    assert schedule.load_state_dict({"step": 7}) is None and schedule.step == 7


def test_the_resume_line_writes_large_counts_in_full():
    """A real run's counts (150,000 steps of 1,024): the samples were printed as 1.536e+08."""
    resumed, line = resumed_with_another_batch(
        ["model.optim.sched.decay_samples=400000000", "model.optim.sched.warmup_steps=0"], 1024, 2048, 150000
    )
    assert resumed.step == 75000
    assert "from the 153600000 samples it has seen: step 150000 of 1024 samples is step 75000 of 2048" in line


def megatron_warmup_from_init(step, lr, init_lr, warmup, min_lr, decay):
    """Megatron's OptimizerParamScheduler.get_lr with --lr-warmup-init (linear decay), in float64."""
    if warmup > 0 and step <= warmup:
        return init_lr + (lr - init_lr) * float(step) / float(warmup)
    if step > decay:
        return min_lr
    return lr - (lr - min_lr) * (step - warmup) / (decay - warmup)


@pytest.mark.parametrize(
    "warmup_flags, batch, warmup",
    [("--train-iters 40 --lr-warmup-iters 8", 1, 8), ("--train-samples 160 --lr-warmup-samples 32", 4, 32)],
)
def test_lr_warmup_init_starts_the_warmup_at_its_rate_as_megatron(warmup_flags, batch, warmup):
    """--lr-warmup-init 1e-5 (Megatron: the warmup climbs from it, not from 0), in iterations and in
    samples: the rate at every iteration is Megatron's formula at that iteration's count (samples
    count the iteration x 4). Both sides are float64 of a few operations: within a few ulp."""
    from gptrain.config import load_training_config
    from gptrain.megatron.translate import translate
    from gptrain.train.schedule import spec_from_config

    flags = (
        "--num-layers 2 --hidden-size 8 --num-attention-heads 2 --seq-length 16 --micro-batch-size 4"
        " --global-batch-size 4 --mock-data --vocab-size 64 --lr 3e-4 --min-lr 3e-5 --lr-decay-style linear"
        f" --lr-warmup-init 1e-5 {warmup_flags}"
    )
    cfg = load_training_config(None, translate(shlex.split(flags), {}).overrides, report_ignored=False)
    assert cfg.model.optim.sched.warmup_init_lr == 1e-5
    spec = spec_from_config(cfg)
    decay = 40 * batch
    for iteration in (0, 1, 3, 4, 7, 8, 9, 20, 39, 40):
        expected = megatron_warmup_from_init(iteration * batch, 3e-4, 1e-5, warmup, 3e-5, decay)
        assert lr_at(iteration, spec) == pytest.approx(expected, rel=1e-14, abs=0)
    assert lr_at(0, spec) == 1e-5


def test_warmup_init_lr_is_refused_where_nemos_warmup_has_no_start_rate():
    from gptrain.config import load_training_config
    from gptrain.train.schedule import spec_from_config

    overrides = ["model.optim.sched.warmup_steps=4", "model.optim.sched.constant_steps=0"]
    cfg = load_training_config("gpt3/126m", [*overrides, "model.optim.sched.warmup_init_lr=1e-5"])
    with pytest.raises(
        ConfigError,
        match="warmup_init_lr=1e-05: NeMo's CosineAnnealing warmup .*set model.optim.sched.warmup_style=megatron",
    ):
        spec_from_config(cfg)
    with pytest.raises(ConfigError, match="warmup_init_lr=-1.0 is negative"):
        ScheduleSpec("LinearAnnealing", lr=1.0, min_lr=0.0, max_steps=10, warmup_init_lr=-1.0)
