"""Resuming with a changed learning-rate schedule: the config applies (as NeMo; Megatron refuses
unless told which to take), and one line names each changed setting and the rate before and after."""

import math

import pytest
from train_e2e_helpers import MOCK, log_lines, run_recording, tiny_config

from gptrain.config import load_training_config
from gptrain.errors import EXIT_REQUEUE
from gptrain.train.schedule import LRSchedule, ScheduleSpec, spec_from_config
from gptrain.train.schedule_checks import resumed_schedule_change

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")

SHORT = [
    *MOCK,
    "exp_manager.resume_if_exists=true",
    "trainer.max_steps=2",
    "trainer.limit_val_batches=0",
    "trainer.limit_test_batches=0",
    "model.num_layers=1",
    "model.hidden_size=16",
    "model.num_attention_heads=2",
    "model.encoder_seq_length=8",
    "model.optim.sched.name=CosineAnnealing",
    "model.optim.sched.warmup_steps=0",
]
CHANGED = "learning-rate schedule changed since the checkpoint"


def changed_lines(run) -> list[str]:
    return [line for line in log_lines(run) if line.startswith(CHANGED)]


def cosine_rate(lr: float, min_lr: float, step: int, length: int) -> float:
    """Cosine decay from lr to min_lr over `length` steps, no warmup (the formula, in float64)."""
    if step >= length:
        return min_lr
    return min_lr + 0.5 * (1 + math.cos(math.pi * step / length)) * (lr - min_lr)


def test_a_resume_with_a_larger_max_steps_names_the_change_and_the_jump(tmp_path, monkeypatch):
    """The first run ends its decay at min_lr; raised to 4 steps, the schedule puts iteration 3
    half-way down the cosine: the rate jumps back up, and the resume says so."""
    run = tmp_path / "run"
    assert run_recording(monkeypatch, tiny_config(run, *SHORT))[0] == 0
    cfg = tiny_config(run, *SHORT, "trainer.max_steps=4")
    code, losses = run_recording(monkeypatch, cfg)
    assert code == 0 and sorted(losses) == [3, 4]
    lr, min_lr = cfg.model.optim.lr, cfg.model.optim.sched.min_lr
    before, after = cosine_rate(lr, min_lr, 2, 2), cosine_rate(lr, min_lr, 2, 4)
    assert before == min_lr and after > 5 * min_lr
    assert changed_lines(run) == [
        f"{CHANGED} (this run's config applies): trainer.max_steps 2 -> 4; learning rate of iteration 3:"
        f" {before:.6E} by the checkpoint's schedule, {after:.6E} now (set them back to go on with the"
        " checkpoint's)"
    ]


def test_a_resume_whose_schedule_is_unchanged_says_nothing(tmp_path, monkeypatch):
    """A requeue with the same config; then trainer.max_steps raised, but the schedule's length is
    model.optim.sched.max_steps in both runs."""
    run, fixed = tmp_path / "run", "model.optim.sched.max_steps=2"
    assert run_recording(monkeypatch, tiny_config(run, *SHORT, fixed), signal_at=1)[0] == EXIT_REQUEUE
    assert run_recording(monkeypatch, tiny_config(run, *SHORT, fixed))[0] == 0
    code, losses = run_recording(monkeypatch, tiny_config(run, *SHORT, fixed, "trainer.max_steps=3"))
    assert code == 0 and sorted(losses) == [3]
    assert sum(line.startswith("resuming from ") for line in log_lines(run)) == 2
    assert changed_lines(run) == []


def config(*overrides: str):
    return load_training_config("gpt3/126m", list(overrides), report_ignored=False)


def resumed(saved_cfg, cfg, steps: int) -> LRSchedule:
    """A schedule of `cfg` loaded from the state a run of `saved_cfg` saved after `steps` steps."""
    saved = LRSchedule(None, spec_from_config(saved_cfg))
    saved.step = steps
    schedule = LRSchedule(None, spec_from_config(cfg))
    schedule.load_state_dict(saved.state_dict())
    return schedule


def test_each_changed_setting_is_named_by_its_key_old_to_new():
    base = [
        "trainer.max_steps=100",
        "model.optim.sched.warmup_steps=10",
        "model.optim.sched.constant_steps=0",
    ]
    changed = [
        *base,
        "model.optim.lr=0.001",
        "model.optim.sched.min_lr=0.0001",
        "model.optim.sched.warmup_steps=20",
        "model.optim.sched.name=LinearAnnealing",
    ]
    line = resumed_schedule_change(config(*changed), resumed(config(*base), config(*changed), 50), 51)
    assert line is not None
    assert (
        "model.optim.sched.name CosineAnnealing -> LinearAnnealing, model.optim.lr 0.0006 -> 0.001, "
        "model.optim.sched.min_lr 6e-05 -> 0.0001, model.optim.sched.warmup_steps 10 -> 20;"
    ) in line
    assert "learning rate of iteration 51:" in line


def test_a_schedule_in_samples_is_compared_in_samples_across_a_batch_change():
    """decay_samples and warmup_samples unchanged under another global batch: the same schedule in
    samples (its steps rescaled), nothing to say; a changed decay_samples is named in samples."""
    samples = [
        "model.optim.sched.decay_samples=4096",
        "model.optim.sched.warmup_steps=null",
        "model.optim.sched.warmup_samples=256",
    ]
    saved = config(*samples, "model.global_batch_size=8")
    same = config(*samples, "model.global_batch_size=16")
    assert resumed_schedule_change(same, resumed(saved, same, 40), 21) is None
    longer = config(*samples, "model.global_batch_size=16", "model.optim.sched.decay_samples=8192")
    line = resumed_schedule_change(longer, resumed(saved, longer, 40), 21)
    assert line is not None and "model.optim.sched.decay_samples 4096 -> 8192;" in line


def test_a_checkpoint_from_before_the_settings_were_recorded_resumes_silently():
    schedule = LRSchedule(None, ScheduleSpec("CosineAnnealing", 1.0, 0.1, max_steps=10, global_batch_size=4))
    assert schedule.load_state_dict({"step": 6, "global_batch_size": 4}) is None
    assert schedule.step == 6 and schedule.resumed is None
    assert resumed_schedule_change(config(), schedule, 7) is None


def test_a_recorded_schedule_this_version_cannot_rebuild_resumes_without_the_note():
    """The record is only compared for a note: a schedule name this version does not know (a later
    gptrain's) raised inside the checkpoint's load, and the resume took a sound checkpoint for damaged."""
    spec = ScheduleSpec("CosineAnnealing", 1.0, 0.1, max_steps=10, global_batch_size=4)
    saved = LRSchedule(None, spec)
    saved.step = 6
    state = saved.state_dict() | {"name": "SomeLaterSchedule"}
    schedule = LRSchedule(None, spec)
    assert schedule.load_state_dict(state) is None
    assert schedule.step == 6 and schedule.resumed is None
    assert resumed_schedule_change(config(), schedule, 7) is None


def test_a_changed_warmup_start_is_named_and_an_older_checkpoint_is_read_as_from_0():
    """warmup_init_lr is recorded with the other settings; a checkpoint saved before it was recorded
    warmed up from 0, and its other settings are still compared."""
    base = [
        "trainer.max_steps=100",
        "model.optim.sched.warmup_steps=10",
        "model.optim.sched.warmup_style=megatron",
    ]
    started = [*base, "model.optim.sched.warmup_init_lr=1e-5"]
    line = resumed_schedule_change(config(*started), resumed(config(*base), config(*started), 5), 6)
    assert line is not None and "model.optim.sched.warmup_init_lr 0 -> 1e-05;" in line
    saved = LRSchedule(None, spec_from_config(config(*base)))
    saved.step = 5
    older = {k: v for k, v in saved.state_dict().items() if k != "warmup_init_lr"}
    schedule = LRSchedule(None, spec_from_config(config(*started)))
    schedule.load_state_dict(older)
    assert schedule.resumed is not None and schedule.resumed[0].warmup_init_lr == 0.0
