"""Issue 14, case 7: a schedule that cannot happen is a warning at start."""

from __future__ import annotations

import pytest
from reliability_helpers import train_args

from gptrain.cli import main
from gptrain.config import load_training_config
from gptrain.errors import ConfigError
from gptrain.train.builders import schedule_spec
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
