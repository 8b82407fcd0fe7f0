"""A run's saves record the validation loss of their step."""

import json

import pytest
from train_e2e_helpers import MOCK, run_recording, tiny_config

from gptrain.checkpoint.integrity import COMPLETE
from gptrain.errors import EXIT_REQUEUE
from gptrain.train import eval_splits
from gptrain.train.results import TB_VAL_LOSS

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")

KEEP_ALL = "exp_manager.checkpoint_callback_params.save_top_k=-1"


def recorded_metrics(log_dir, step):
    return json.loads((log_dir / "checkpoints" / f"step_{step}" / COMPLETE).read_text()).get("metrics")


def validation_losses(monkeypatch) -> dict[int, float]:
    """{iteration: loss} of each validation the run evaluates (not the test split's)."""
    losses: dict[int, float] = {}
    real_evaluate_split = eval_splits.evaluate_split

    def evaluate_split(s, data, batches, where, tag):
        loss = real_evaluate_split(s, data, batches, where, tag)
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


def test_a_save_on_a_stop_records_no_val_loss(tmp_path, monkeypatch):
    """A stop at 3 saves before the validation due at 3, which the resumed run runs first: neither the
    stop's save nor the next one (at 4) records an older step's loss."""
    losses = validation_losses(monkeypatch)
    code, _ = run_recording(monkeypatch, tiny_config(tmp_path, *MOCK, KEEP_ALL), signal_at=3)
    assert code == EXIT_REQUEUE and losses == {} and recorded_metrics(tmp_path, 3) is None
    code, _ = run_recording(monkeypatch, tiny_config(tmp_path, *MOCK, KEEP_ALL))
    assert code == 0 and sorted(losses) == [3, 6]
    assert recorded_metrics(tmp_path, 3) is None and recorded_metrics(tmp_path, 4) is None
    assert recorded_metrics(tmp_path, 6) == {"val_loss": losses[6]}
