"""A run resumed with a smaller global batch than it began with: the train split, sized for
trainer.max_steps x global batch (Megatron's formula), ends before max_steps, and the error says
which trainer.train_samples builds it for what the run reads."""

import pytest
from train_e2e_helpers import MOCK, run_recording, tiny_config

from gptrain.errors import DataError

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")

SHAPE = [
    *MOCK,
    "trainer.val_check_interval=1000",
    "exp_manager.checkpoint_callback_params.every_n_train_steps=4",
]


def test_a_resume_with_a_smaller_global_batch_names_the_train_samples_it_needs(tmp_path, monkeypatch):
    log_dir = tmp_path / "run"
    larger = tiny_config(log_dir, *SHAPE, "trainer.max_steps=4", "model.global_batch_size=8")
    assert run_recording(monkeypatch, larger)[0] == 0  # 32 samples consumed at iteration 4
    smaller = [*SHAPE, "trainer.max_steps=10", "model.global_batch_size=4"]  # a split of 40 samples
    with pytest.raises(DataError) as ran_out:
        run_recording(monkeypatch, tiny_config(log_dir, *smaller))
    message = str(ran_out.value)
    assert message.startswith(
        "the train split ran out of samples at iteration 7 (after 40 consumed samples): "
    )
    assert "set trainer.train_samples=56 (those consumed plus 4 iterations of 4)" in message  # 40 + 4 x 4
    code, losses = run_recording(monkeypatch, tiny_config(log_dir, *smaller, "trainer.train_samples=56"))
    assert code == 0 and max(losses) == 10


def test_a_split_too_small_for_max_steps_still_asks_for_data(tmp_path, monkeypatch):
    from gptrain.config import load_training_config
    from gptrain.train.step_loop import ran_out_of_samples

    cfg = load_training_config("gpt3/126m", ["trainer.max_steps=10", "model.global_batch_size=4"])
    assert ran_out_of_samples(cfg, 7, 24).endswith(
        "(after 24 consumed samples): add data or lower trainer.max_steps"
    )


def test_a_schedule_in_samples_goes_on_from_its_samples_after_a_resume_with_another_batch(
    tmp_path, monkeypatch
):
    """Megatron's --lr-decay-samples schedule counts samples: resumed at a global batch of 4 after 4
    iterations of 8, the printed rates are Megatron's at 32 + 4 x (iteration - 4) samples (they were
    its rates at 4 x iteration samples, the 4 saved steps taken as steps of 4)."""
    import math
    import re

    from train_e2e_helpers import log_lines

    sched = [
        "model.optim.lr=1e-3",
        "model.optim.sched.min_lr=1e-4",
        "model.optim.sched.warmup_steps=0",
        "model.optim.sched.warmup_samples=8",
        "model.optim.sched.decay_samples=64",
        "model.optim.sched.warmup_style=megatron",
    ]
    log_dir = tmp_path / "run"
    larger = tiny_config(log_dir, *SHAPE, *sched, "trainer.max_steps=4", "model.global_batch_size=8")
    assert run_recording(monkeypatch, larger)[0] == 0
    smaller = [
        *SHAPE,
        *sched,
        "trainer.max_steps=10",
        "model.global_batch_size=4",
        "trainer.train_samples=56",
    ]
    assert run_recording(monkeypatch, tiny_config(log_dir, *smaller))[0] == 0

    def megatron(samples: int) -> float:  # OptimizerParamScheduler.get_lr, cosine, step in samples
        if samples <= 8:
            return 1e-3 * samples / 8
        if samples > 64:
            return 1e-4
        return 1e-4 + 0.5 * (math.cos(math.pi * (samples - 8) / (64 - 8)) + 1.0) * (1e-3 - 1e-4)

    lines = log_lines(log_dir)
    printed = {
        int(m.group(1)): float(m.group(2))
        for line in lines
        if (m := re.search(r"iteration +(\d+)/ +\d+ \|.*learning rate: ([0-9.E+-]+) \|", line))
    }
    assert sorted(printed) == list(range(1, 11))
    for iteration in range(5, 11):  # the rate after the iteration's update, printed with 7 digits
        assert printed[iteration] == pytest.approx(megatron(32 + 4 * (iteration - 4)), rel=1e-6)
    assert (
        "learning-rate schedule: model.global_batch_size=4, the checkpoint's was 8; the schedule counts "
        "samples (model.optim.sched.decay_samples/warmup_samples, as Megatron's --lr-*-samples), so it goes "
        "on from the 32 samples it has seen: step 4 of 8 samples is step 8 of 4"
    ) in lines
