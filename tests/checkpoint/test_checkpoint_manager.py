import pytest
import torch

from gptrain.checkpoint.manager import COMPLETE, LATEST, CheckpointManager, complete_steps, newest_complete

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")


def state_for(value: float) -> dict:
    return {"model": {"w": torch.full((3, 2), value)}, "train": {"step": int(value)}}


def save_steps(manager, steps):
    for step in steps:
        manager.save(step, state_for(float(step)), {"rng": torch.tensor([step])})


def test_save_load_round_trip_with_rank_state(tmp_path):
    manager = CheckpointManager(tmp_path, keep_last=3)
    path = manager.save(7, state_for(7.0), {"rng": torch.tensor([1, 2, 3])})
    assert (path / COMPLETE).is_file() and (path / ".metadata").is_file()
    assert (tmp_path / LATEST).read_text().strip() == "step_7"
    target = state_for(0.0)
    applied = {}
    extra = manager.load(path, target, applied.update)
    assert torch.equal(target["model"]["w"], torch.full((3, 2), 7.0))
    assert applied["train"] == {"step": 7}
    assert torch.equal(extra["rng"], torch.tensor([1, 2, 3]))


def test_retention_keeps_last_k_complete(tmp_path):
    manager = CheckpointManager(tmp_path, keep_last=2)
    save_steps(manager, [1, 2, 3, 4])
    assert complete_steps(tmp_path) == [3, 4]
    assert sorted(p.name for p in tmp_path.iterdir() if p.is_dir()) == ["step_3", "step_4"]
    keep_all = CheckpointManager(tmp_path / "all", keep_last=-1)
    save_steps(keep_all, [1, 2, 3])
    assert complete_steps(tmp_path / "all") == [1, 2, 3]


def test_incomplete_checkpoint_is_ignored(tmp_path):
    manager = CheckpointManager(tmp_path, keep_last=5)
    save_steps(manager, [2, 4])
    (tmp_path / "step_4" / COMPLETE).unlink()  # died after writing data, before the marker
    (tmp_path / "step_6").mkdir()  # died at the very start
    (tmp_path / "step_x").mkdir()
    assert newest_complete(tmp_path) == tmp_path / "step_2"
    assert manager.newest() == tmp_path / "step_2"
    assert newest_complete(tmp_path / "missing") is None
    save_steps(manager, [8])  # a later complete save cleans up the torn ones below it
    assert not (tmp_path / "step_4").exists() and not (tmp_path / "step_6").exists()
    assert complete_steps(tmp_path) == [2, 8]


def test_marker_written_after_data(tmp_path, monkeypatch):
    """The latest marker must never point at a checkpoint whose data is not yet complete."""
    import torch.distributed.checkpoint as dcp

    seen = {}
    real_save = dcp.save

    def spying_save(state, checkpoint_id):
        seen["latest_before"] = (tmp_path / LATEST).exists()
        seen["complete_before"] = (tmp_path / "step_1" / COMPLETE).exists()
        return real_save(state, checkpoint_id=checkpoint_id)

    monkeypatch.setattr(dcp, "save", spying_save)
    CheckpointManager(tmp_path, keep_last=1).save(1, state_for(1.0), {})
    assert seen == {"latest_before": False, "complete_before": False}
    assert (tmp_path / "step_1" / COMPLETE).is_file()


def test_async_save_snapshots_state_and_marks_on_wait(tmp_path):
    manager = CheckpointManager(tmp_path, keep_last=2, async_save=True)
    state = state_for(3.0)
    manager.save(3, state, {})
    state["model"]["w"].fill_(99.0)  # training continues while the save runs
    manager.wait()
    assert newest_complete(tmp_path) == tmp_path / "step_3"
    target = state_for(0.0)
    manager.load(tmp_path / "step_3", target, lambda s: None)
    assert torch.equal(target["model"]["w"], torch.full((3, 2), 3.0))


@pytest.mark.parametrize("keep", [0, None])
def test_zero_or_none_keep_means_keep_all(tmp_path, keep):
    manager = CheckpointManager(tmp_path, keep_last=keep)
    save_steps(manager, [1, 2])
    assert complete_steps(tmp_path) == [1, 2]
