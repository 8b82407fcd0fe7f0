"""model.optim.sched.from_checkpoint (Megatron's --use-checkpoint-opt_param-scheduler): a resume takes
the schedule the checkpoint records (name, lr, min_lr, warmup, decay length, as Megatron's scheduler
takes them from its state) over the config's; before, the flag was refused."""

import pytest
from train_e2e_helpers import MOCK, log_lines, run_recording, tiny_config

from gptrain.config import load_training_config
from gptrain.errors import ConfigError
from gptrain.train.resuming import take_checkpoints_schedule
from gptrain.train.schedule import LRSchedule, lr_at, spec_from_config

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")

SHAPE = [
    *MOCK,
    "exp_manager.resume_if_exists=true",
    "trainer.log_every_n_steps=1",
    "trainer.limit_val_batches=0",
    "trainer.limit_test_batches=0",
    "model.num_layers=1",
    "model.hidden_size=16",
    "model.num_attention_heads=2",
    "model.encoder_seq_length=8",
    "model.optim.sched.constant_steps=0",
    "model.optim.sched.warmup_style=megatron",
]
SAVED = [
    "trainer.max_steps=3",
    "model.optim.lr=1e-3",
    "model.optim.sched.min_lr=1e-4",
    "model.optim.sched.name=LinearAnnealing",
    "model.optim.sched.warmup_steps=2",
    "model.optim.sched.max_steps=8",
]
CHANGED = [
    "trainer.max_steps=6",
    "model.optim.lr=3e-3",
    "model.optim.sched.min_lr=0.0",
    "model.optim.sched.name=CosineAnnealing",
    "model.optim.sched.warmup_steps=1",
    "model.optim.sched.max_steps=20",
]


def rates(run):
    return [
        float(line.split("learning rate: ")[1].split(" ")[0])
        for line in log_lines(run)
        if "learning rate: " in line
    ]


@pytest.mark.parametrize("from_checkpoint", [True, False])
def test_a_resume_takes_the_checkpoints_schedule_only_when_asked(tmp_path, monkeypatch, from_checkpoint):
    run = tmp_path / "run"
    assert run_recording(monkeypatch, tiny_config(run, *SHAPE, *SAVED))[0] == 0
    resumed = tiny_config(
        run, *SHAPE, *CHANGED, f"model.optim.sched.from_checkpoint={str(from_checkpoint).lower()}"
    )
    assert run_recording(monkeypatch, resumed)[0] == 0
    saved_spec = spec_from_config(tiny_config(run, *SHAPE, *SAVED))
    followed = saved_spec if from_checkpoint else spec_from_config(resumed)
    # iteration i logs the rate after it, that of step i; iterations 4 to 6 are the resumed run's
    assert rates(run)[3:] == pytest.approx([lr_at(step, followed) for step in (4, 5, 6)], rel=1e-6)
    taken = [line for line in log_lines(run) if line.startswith("learning-rate schedule from the checkpoint")]
    if from_checkpoint:
        assert taken == [
            "learning-rate schedule from the checkpoint (model.optim.sched.from_checkpoint=true), not this run's"
            " config: model.optim.sched.name LinearAnnealing (config CosineAnnealing), model.optim.lr 0.001"
            " (config 0.003), model.optim.sched.min_lr 0.0001 (config 0), model.optim.sched.max_steps 8 (config"
            " 20), model.optim.sched.warmup_steps 2 (config 1)"
        ]
    else:
        assert taken == []


def schedule_saved_at(step, saved, now):
    schedule = LRSchedule(None, spec_from_config(saved))
    schedule.step = step
    loaded = LRSchedule(None, spec_from_config(now))
    loaded.load_state_dict(schedule.state_dict())
    return loaded


def config(*overrides):
    base = [
        "model.optim.sched.constant_steps=0",
        "model.optim.sched.warmup_style=megatron",
        "model.micro_batch_size=1",
    ]
    return load_training_config("gpt3/126m", [*base, *overrides], report_ignored=False)


def test_a_schedule_in_samples_under_another_batch_keeps_the_checkpoints_samples():
    """Megatron's lengths are samples: the checkpoint's 4000-sample decay at batch 8 (500 steps) is 250
    steps of batch 16, where the resumed step (40 of 8 -> 20 of 16) is counted."""
    samples = ["model.optim.sched.warmup_steps=null", "model.optim.sched.warmup_samples=80"]
    saved = config(*samples, "model.optim.sched.decay_samples=4000", "model.global_batch_size=8")
    now = config(*samples, "model.optim.sched.decay_samples=8000", "model.global_batch_size=16")
    schedule = schedule_saved_at(40, saved, now)
    assert take_checkpoints_schedule(schedule) == ["model.optim.sched.max_steps 250 (config 500)"]
    assert (schedule.step, schedule.spec.max_steps, schedule.spec.warmup_steps) == (20, 250, 5)
    assert schedule.current_lr() == lr_at(40, spec_from_config(saved))


def test_nothing_to_take_from_a_checkpoint_without_a_record_or_of_the_same_schedule():
    same = config("model.optim.sched.warmup_steps=10")
    schedule = schedule_saved_at(40, same, same)
    assert take_checkpoints_schedule(schedule) == []
    schedule.resumed = None  # a checkpoint from before the settings were recorded
    assert take_checkpoints_schedule(schedule) == []


def test_a_checkpoints_schedule_that_needs_a_setting_this_config_lacks_is_one_line():
    """Megatron's state does not hold WSD's annealing: a checkpoint's WarmupStableDecay under a config
    of another schedule has none, which is said naming the key to give."""
    wsd = config("model.optim.sched.name=WarmupStableDecay", "model.optim.sched.wsd_decay_steps=20")
    schedule = schedule_saved_at(40, wsd, config())
    with pytest.raises(ConfigError, match="the checkpoint's schedule, WarmupStableDecay, with this run's"):
        take_checkpoints_schedule(schedule)


def start_warnings(run):
    return [line for line in log_lines(run) if line.startswith("warning: the decay ends")]


@pytest.mark.parametrize(("saved_decay", "config_decay"), [(6, 20), (20, 6)])
def test_the_start_warnings_judge_the_schedule_the_resume_takes(
    tmp_path, monkeypatch, saved_decay, config_decay
):
    """The start warnings were made before the checkpoint loaded, of the config's schedule: with
    from_checkpoint the run follows the checkpoint's, so a decay of 20 steps in the config warned of a
    decay ending after the 6-step run that the checkpoint's 6 ends with, and the checkpoint's 20 was
    never warned of. They are now made of the schedule the resume took, and their advice to follow the
    run says from_checkpoint=false too: max_steps=null alone leaves the checkpoint's length."""
    run = tmp_path / "run"
    first = tiny_config(run, *SHAPE, *SAVED[:-1], f"model.optim.sched.max_steps={saved_decay}")
    assert run_recording(monkeypatch, first)[0] == 0
    before = len(start_warnings(run))
    resumed = tiny_config(
        run,
        *SHAPE,
        *SAVED[:-1],
        "trainer.max_steps=6",
        f"model.optim.sched.max_steps={config_decay}",
        "model.optim.sched.from_checkpoint=true",
    )
    assert run_recording(monkeypatch, resumed)[0] == 0
    warned = start_warnings(run)[before:]
    if saved_decay == 6:
        assert warned == []
    else:
        assert warned == [
            "warning: the decay ends after the run: model.optim.sched.max_steps=20 > trainer.max_steps=6, so the"
            f" last rate is {lr_at(5, spec_from_config(first)):.3g}, not min_lr=0.0001; set"
            " model.optim.sched.from_checkpoint=false and model.optim.sched.max_steps=null to follow the"
            " run (the checkpoint's schedule:"
            " model.optim.sched.from_checkpoint=true; false to follow this config's)"
        ]
