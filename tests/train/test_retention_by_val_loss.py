"""A run's saves record the validation loss of their step, and retention by val_loss keeps the best."""

import json
import math

import pytest
from train_e2e_helpers import MOCK, log_lines, run_recording, tiny_config

from gptrain.checkpoint.integrity import COMPLETE, complete_steps, verify
from gptrain.errors import EXIT_REQUEUE
from gptrain.train import eval_splits, loop, saving
from gptrain.train.results import TB_VAL_LOSS

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")

KEEP_ALL = "exp_manager.checkpoint_callback_params.save_top_k=-1"


def recorded_metrics(log_dir, step):
    return json.loads((log_dir / "checkpoints" / f"step_{step}" / COMPLETE).read_text()).get("metrics")


def validation_losses(monkeypatch) -> dict[int, float]:
    """{iteration: loss} of each validation the run evaluates (not the test split's)."""
    losses: dict[int, float] = {}
    real_evaluate_split = eval_splits.evaluate_split

    def evaluate_split(s, data, batches, where, tag, *stop_check):
        loss = real_evaluate_split(s, data, batches, where, tag, *stop_check)
        if tag == TB_VAL_LOSS:
            losses[s.state.step] = loss
        return loss

    monkeypatch.setattr(eval_splits, "evaluate_split", evaluate_split)
    return losses


@pytest.mark.parametrize("async_save", ["false", "true"])
def test_a_save_at_a_validated_step_records_its_val_loss(tmp_path, monkeypatch, async_save):
    """Validation at 3 and 6, saves at 2, 4 and 6: only step_6 ran a validation at its own step."""
    losses = validation_losses(monkeypatch)
    cfg = tiny_config(
        tmp_path, *MOCK, KEEP_ALL, f"exp_manager.checkpoint_callback_params.async_save={async_save}"
    )
    code, _ = run_recording(monkeypatch, cfg)
    assert code == 0 and sorted(losses) == [3, 6]
    assert recorded_metrics(tmp_path, 6) == {"val_loss": losses[6]}  # the float itself, not rounded
    assert recorded_metrics(tmp_path, 2) is None and recorded_metrics(tmp_path, 4) is None


def test_every_n_train_steps_null_saves_at_each_validation_as_lightning_does(tmp_path, monkeypatch):
    """NeMo's checkpoint_callback_params without every_n_train_steps (or null) saves at each validation;
    gptrain refused the null ('must not be null'). Validation every 3 steps of 7, and at the last:
    saves at 3 and 6 and at the end (save_last), each with the loss of its step."""
    losses = validation_losses(monkeypatch)
    cfg = tiny_config(
        tmp_path,
        *MOCK,
        KEEP_ALL,
        "trainer.max_steps=7",
        "trainer.limit_test_batches=0",
        "exp_manager.checkpoint_callback_params.every_n_train_steps=null",
    )
    assert cfg.exp_manager.checkpoint_callback_params.every_n_train_steps == 3
    code, _ = run_recording(monkeypatch, cfg)
    assert code == 0 and sorted(losses) == [3, 6, 7]
    assert complete_steps(tmp_path / "checkpoints") == [3, 6, 7]
    for step in (3, 6, 7):
        assert recorded_metrics(tmp_path, step) == {"val_loss": losses[step]}


def test_every_n_epochs_0_saves_only_lightnings_last_checkpoint_at_each_validation(tmp_path, monkeypatch):
    """every_n_epochs=0 beside every_n_train_steps=null: Lightning saves no top-k checkpoint, only its
    last one, at each validation and at the end (NeMo's on_train_end). gptrain ignored every_n_epochs
    and kept save_top_k of them; now it saves on the same steps and keeps the newest alone."""
    saved: list[int] = []
    real_save = saving.save_checkpoint

    def recording_save(s, *args, **kwargs):
        saved.append(s.state.step)
        return real_save(s, *args, **kwargs)

    monkeypatch.setattr(saving, "save_checkpoint", recording_save)
    every = "exp_manager.checkpoint_callback_params"
    cfg = tiny_config(
        tmp_path,
        *MOCK,
        KEEP_ALL,
        "trainer.max_steps=7",
        f"{every}.every_n_train_steps=null",
        f"{every}.every_n_epochs=0",
    )
    assert cfg.exp_manager.checkpoint_callback_params.save_top_k == 0
    code, _ = run_recording(monkeypatch, cfg)
    assert code == 0 and sorted(set(saved)) == [3, 6, 7]
    assert complete_steps(tmp_path / "checkpoints") == [7]


BY_VAL_LOSS = [
    "trainer.val_check_interval=1",
    "trainer.limit_test_batches=0",
    "exp_manager.checkpoint_callback_params.every_n_train_steps=1",
    "exp_manager.checkpoint_callback_params.monitor=val_loss",
    "exp_manager.checkpoint_callback_params.mode=min",
]


def test_a_resumed_run_records_the_val_loss_its_stop_left_due_and_retention_keeps_it(tmp_path, monkeypatch):
    """A stop at 3 saves before the validation due at 3 (step_3 records no loss); the resumed run
    runs it first and records its loss, the best, in step_3's COMPLETE: retention keeps step_3, where
    it ranked below every checkpoint with a loss and was removed at the next save."""
    losses = {1: 3.0, 2: 2.9, 3: 1.0, 4: 2.0, 5: 2.5, 6: 2.7}
    scripted_validation(monkeypatch, losses)
    cfg = [*MOCK, *BY_VAL_LOSS, "exp_manager.checkpoint_callback_params.save_top_k=1"]
    code, _ = run_recording(monkeypatch, tiny_config(tmp_path, *cfg), signal_at=3)
    marker = tmp_path / "checkpoints" / "step_3" / COMPLETE
    assert code == EXIT_REQUEUE and recorded_metrics(tmp_path, 3) is None
    saved_by_the_stop = marker.read_text()
    code, trained = run_recording(monkeypatch, tiny_config(tmp_path, *cfg))
    assert code == 0 and sorted(trained) == [4, 5, 6]
    assert recorded_metrics(tmp_path, 3) == {"val_loss": 1.0}
    assert complete_steps(tmp_path / "checkpoints") == best_and_newest(losses, 1) == [3, 6]
    metrics = ' "metrics": {\n  "val_loss": 1.0\n },\n "files": {'
    assert marker.read_text().replace(metrics, ' "files": {') == saved_by_the_stop  # the rest byte for byte
    assert verify(marker.parent, checksums=True) is None
    assert "recorded val_loss 1 of iteration 3 in step_3's COMPLETE" in "\n".join(log_lines(tmp_path))


def scripted_validation(monkeypatch, losses: dict[int, float]) -> None:
    """Each validation's loss is `losses[iteration]` instead of the model's."""
    monkeypatch.setattr(
        eval_splits, "evaluate", lambda s, data, num_batches, *stop_check: losses[s.state.step]
    )


def best_and_newest(losses: dict[int, float], top_k: int) -> list[int]:
    """The reference: the top_k lowest (NaN after every number, the newer first on a tie), and the newest."""
    ranked = sorted(losses, key=lambda step: (math.isnan(losses[step]), losses[step], -step))
    return sorted(set(ranked[:top_k]) | {max(losses)})


def test_a_run_by_val_loss_keeps_its_best_checkpoints_and_its_newest(tmp_path, monkeypatch):
    losses = {1: 3.0, 2: 2.5, 3: 2.8, 4: math.nan, 5: 2.6, 6: 2.9}
    scripted_validation(monkeypatch, losses)
    cfg = tiny_config(tmp_path, *MOCK, *BY_VAL_LOSS, "exp_manager.checkpoint_callback_params.save_top_k=2")
    code, _ = run_recording(monkeypatch, cfg)
    assert code == 0
    assert complete_steps(tmp_path / "checkpoints") == best_and_newest(losses, 2) == [2, 5, 6]
    saved = [line for line in log_lines(tmp_path) if line.startswith("saved checkpoint step_5 ")]
    assert saved and saved[0].endswith(
        "; removed step_3 (val_loss 2.8, not among the 2 best); removed step_4 (val_loss nan, not among the 2 best)"
    )


def test_a_resumed_run_ranks_the_checkpoints_saved_before_it_by_their_val_loss(tmp_path, monkeypatch):
    """The first attempt ends at 3 (trainer.exit_interval) keeping step_1 (the best) and step_3 (the
    newest); the resumed one keeps step_1 over its own, worse, checkpoints, by the loss its COMPLETE
    recorded."""
    losses = {1: 1.0, 2: 3.0, 3: 2.0, 4: 4.0, 5: 5.0, 6: 6.0}
    scripted_validation(monkeypatch, losses)
    cfg = [*MOCK, *BY_VAL_LOSS, "exp_manager.checkpoint_callback_params.save_top_k=1"]
    code, _ = run_recording(monkeypatch, tiny_config(tmp_path, *cfg, "trainer.exit_interval=3"))
    assert code == 0 and complete_steps(tmp_path / "checkpoints") == [1, 3]
    code, trained = run_recording(monkeypatch, tiny_config(tmp_path, *cfg))
    assert code == 0 and sorted(trained) == [4, 5, 6]
    assert complete_steps(tmp_path / "checkpoints") == best_and_newest(losses, 1) == [1, 6]


@pytest.mark.parametrize(
    ("overrides", "warning"),
    [
        (
            ["trainer.val_check_interval=3", "exp_manager.checkpoint_callback_params.every_n_train_steps=2"],
            "warning: exp_manager.checkpoint_callback_params.every_n_train_steps=2 is not a multiple of "
            "trainer.val_check_interval=3: the saves between validations record no val_loss and rank below "
            "every save that does (monitor=val_loss); make it a multiple to rank them all",
        ),
        (
            ["trainer.limit_val_batches=0"],
            "warning: exp_manager.checkpoint_callback_params.monitor=val_loss, but no validation runs "
            "(trainer.val_check_interval=1, trainer.limit_val_batches=0): no save records it, so the newest "
            "2 are kept",
        ),
    ],
)
def test_a_run_by_val_loss_whose_saves_miss_validation_says_so_at_the_start(tmp_path, overrides, warning):
    """NeMo saves at each validation; gptrain on its own interval, where a save without validation
    records no val_loss: without the line, such a run quietly keeps its newest instead of its best."""
    cfg = tiny_config(tmp_path, *MOCK, *BY_VAL_LOSS, "trainer.max_steps=1", *overrides)
    assert loop.train(cfg) == 0
    assert warning in log_lines(tmp_path)
    quiet = tiny_config(tmp_path / "quiet", *MOCK, *BY_VAL_LOSS)  # saves at every validation
    assert (
        saving.retention_warning(quiet) is None
        and saving.retention_warning(tiny_config(tmp_path, *MOCK)) is None
    )
