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
    from gptrain.train.loop import ran_out_of_samples

    cfg = load_training_config("gpt3/126m", ["trainer.max_steps=10", "model.global_batch_size=4"])
    assert ran_out_of_samples(cfg, 7, 24).endswith(
        "(after 24 consumed samples): add data or lower trainer.max_steps"
    )
