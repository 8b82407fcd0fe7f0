import json
import sys
from pathlib import Path

import pytest
import torch

from gptrain.checkpoint.compat import CheckpointMismatchError
from gptrain.checkpoint.directory import LATEST, newest_complete
from gptrain.checkpoint.integrity import COMPLETE, complete_steps, is_complete
from gptrain.checkpoint.manager import CheckpointManager

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


def test_a_rank_of_a_larger_world_than_saved_reads_rank_0s_records(tmp_path):
    """A world grown between requeues (2 ranks to 4, the same TP and PP): ranks 2 and 3 have no rank
    file and got nothing, and the last rank prints the console's lines, so the data order changed
    since the checkpoint (a longer trainer.max_steps) was said only in rank 0's log file. They read
    rank 0's file now; its streams are theirs too (TP 1, PP 1: one stream, data-parallel ranks share
    it), taken where the run's world is known (a process group: 4 ranks here), and restored, as the
    other ranks restore theirs (tests/checkpoint/test_rank_streams.py). A rank with a file reads its own."""
    from gptrain.checkpoint.rank_state import read_rank_state
    from gptrain.train.state import rank_state, restore_rng_state

    saved_layout = {
        "world_size": 2,
        "tensor_model_parallel_size": 1,
        "pipeline_model_parallel_size": 1,
        "sequence_parallel": False,
    }
    order = {"consumed": 16, "max_steps": 6}
    step_dir = CheckpointManager(tmp_path, keep_last=1).save(
        4, state_for(4.0), {**rank_state(saved_layout), "train_order": order}
    )
    torch.save({"own": 1}, step_dir / "rank_1.pt")

    def extra_of(rank):
        return CheckpointManager(tmp_path, keep_last=1, rank=rank).load(
            step_dir, state_for(0.0), lambda s: None
        )

    assert extra_of(1) == {"own": 1}
    extra = extra_of(3)
    assert extra["train_order"] == order
    assert "rng" not in extra  # no process group: the world, and so rank 3's position, is not known
    extra = read_rank_state(step_dir, 3, world=4)
    assert extra["train_order"] == order
    saved_streams = torch.load(step_dir / "rank_0.pt", weights_only=False)["rng"]
    assert torch.equal(extra["rng"]["torch"], saved_streams["torch"])
    lines = []
    assert restore_rng_state(extra, {**saved_layout, "world_size": 4}, lines.append) and lines == []


LAYOUT_OF_2 = {
    "world_size": 2,
    "tensor_model_parallel_size": 2,
    "pipeline_model_parallel_size": 1,
    "sequence_parallel": False,
}


def test_a_rank_of_the_world_that_saved_without_its_file_does_not_take_rank_0s_streams(tmp_path):
    """Rank 1 of the 2 (TP 2) that saved the checkpoint, its rank file missing (damage, or a checkpoint
    from before manifests): it took rank 0's file, and so rank 0's streams, which tensor ranks must
    not share. It gets no rank state, as before rank files were shared."""
    from gptrain.train.state import rank_state, restore_rng_state

    step_dir = CheckpointManager(tmp_path, keep_last=1).save(
        4, state_for(4.0), {**rank_state(LAYOUT_OF_2), "train_order": {"consumed": 16}}
    )
    extra = CheckpointManager(tmp_path, keep_last=1, rank=1).load(step_dir, state_for(0.0), lambda s: None)
    assert extra == {}
    assert not restore_rng_state(extra, LAYOUT_OF_2, [].append)


def test_without_a_recorded_layout_the_manifest_tells_the_world_that_saved(tmp_path):
    """A rank file without rng_layout (saved before it was recorded): the manifest's rank files are the
    world that saved it. Saved by one process, rank 1 of a grown world reads rank 0's records; where
    the marker has no manifest either (before manifests), nothing says the world grew: nothing read."""
    step_dir = CheckpointManager(tmp_path, keep_last=1).save(
        4, state_for(4.0), {"rng": torch.tensor([1]), "train_order": {"consumed": 16}}
    )

    def extra_of_rank_1():
        return CheckpointManager(tmp_path, keep_last=1, rank=1).load(step_dir, state_for(0.0), lambda s: None)

    assert extra_of_rank_1() == {"train_order": {"consumed": 16}}
    (step_dir / COMPLETE).write_text(json.dumps({"step": 4}))
    assert extra_of_rank_1() == {}


def test_a_rank_file_of_rank_0_that_does_not_load_is_named_by_a_rank_that_read_it(tmp_path):
    """Rank 3 of a world grown from one process reads rank 0's file; where that does not load, the
    verdict named rank_3.pt, which does not exist. It names rank_0.pt, the file read."""
    from gptrain.checkpoint.errors import CheckpointDamagedError

    step_dir = CheckpointManager(tmp_path, keep_last=1).save(4, state_for(4.0), {"rng": torch.tensor([1])})
    (step_dir / "rank_0.pt").write_bytes(b"not a torch file")
    reader = CheckpointManager(tmp_path, keep_last=1, rank=3)
    with pytest.raises(CheckpointDamagedError) as error:
        reader.load_verified(step_dir, lambda saved: state_for(0.0), lambda s: None)
    assert error.value.problem.startswith(f"{step_dir / 'rank_0.pt'} does not load (")


def test_retention_keeps_last_k_complete(tmp_path):
    manager = CheckpointManager(tmp_path, keep_last=2)
    save_steps(manager, [1, 2, 3, 4])
    manager.close()  # old ones are removed in the background
    assert complete_steps(tmp_path) == [3, 4]
    assert sorted(p.name for p in tmp_path.iterdir() if p.is_dir()) == ["step_3", "step_4"]
    keep_all = CheckpointManager(tmp_path / "all", keep_last=-1)
    save_steps(keep_all, [1, 2, 3])
    assert complete_steps(tmp_path / "all") == [1, 2, 3]


def test_retention_keeps_the_save_it_made_and_leaves_newer_steps_alone(tmp_path):
    """A step newer than a save is one the run did not resume from (damaged, not moved aside): counted
    for keep_last it deleted the new save; it stays until the run passes it."""
    save_steps(CheckpointManager(tmp_path, keep_last=5), [2, 4])
    requeued = CheckpointManager(tmp_path, keep_last=1)
    save_steps(requeued, [3])
    assert complete_steps(tmp_path) == [3, 4]
    save_steps(requeued, [6])
    assert complete_steps(tmp_path) == [6]


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
    manager.close()
    assert not (tmp_path / "step_4").exists() and not (tmp_path / "step_6").exists()
    assert complete_steps(tmp_path) == [2, 8]


@pytest.mark.parametrize("async_save", [False, True])
def test_a_file_named_like_a_step_is_left_alone_and_saves_go_on(tmp_path, async_save):
    """A stray file step_1 (a note, a copy gone wrong) was taken for a torn save older than the next one:
    retention unlinked step_1/COMPLETE, ENOTDIR, and every save of the run failed with 'free space or
    fix permissions'. It is no checkpoint: saves and retention go on and leave it as it is."""
    (tmp_path / "step_1").write_text("not a checkpoint\n")
    manager = CheckpointManager(tmp_path, keep_last=2, async_save=async_save)
    for step in (2, 3, 4):
        manager.save(step, state_for(float(step)), {})
        manager.wait()
    manager.close()
    assert complete_steps(tmp_path) == [3, 4] and (tmp_path / LATEST).read_text() == "step_4\n"
    assert (tmp_path / "step_1").read_text() == "not a checkpoint\n"


def test_marker_written_after_data(tmp_path, monkeypatch):
    """The latest marker must never point at a checkpoint whose data is not yet complete."""
    import torch.distributed.checkpoint as dcp

    seen = {}
    real_save = dcp.save

    def spying_save(state, checkpoint_id, **kwargs):
        seen["latest_before"] = (tmp_path / LATEST).exists()
        seen["complete_before"] = (tmp_path / "step_1" / COMPLETE).exists()
        return real_save(state, checkpoint_id=checkpoint_id, **kwargs)

    monkeypatch.setattr(dcp, "save", spying_save)
    CheckpointManager(tmp_path, keep_last=1).save(1, state_for(1.0), {})
    assert seen == {"latest_before": False, "complete_before": False}
    assert (tmp_path / "step_1" / COMPLETE).is_file()


def test_async_save_snapshots_state_and_marks_on_wait(tmp_path):
    manager = CheckpointManager(tmp_path, keep_last=2, async_save=True)
    state = state_for(3.0)
    manager.save(3, state, {})
    manager.wait_for_staging()  # what the optimizer's pre-step hook does before changing weights
    state["model"]["w"].fill_(99.0)  # training continues while the save writes
    manager.wait()
    assert newest_complete(tmp_path) == tmp_path / "step_3"
    target = state_for(0.0)
    manager.load(tmp_path / "step_3", target, lambda s: None)
    assert torch.equal(target["model"]["w"], torch.full((3, 2), 3.0))


@pytest.mark.parametrize("keep", [-1, None])
def test_minus_one_or_none_keep_means_keep_all(tmp_path, keep):
    """save_top_k=-1 keeps every checkpoint (0 keeps only the newest: tests/checkpoint/test_retention.py)."""
    manager = CheckpointManager(tmp_path, keep_last=keep)
    save_steps(manager, [1, 2])
    assert complete_steps(tmp_path) == [1, 2]


@pytest.mark.parametrize("saved_rows, live_rows", [(6, 8), (8, 4)])
@pytest.mark.parametrize("key", ["model.tok_embeddings.weight", "optim.state.output.weight.exp_avg"])
def test_load_fits_rows_when_vocabulary_padding_changed(tmp_path, saved_rows, live_rows, key):
    """The padded vocabulary changes with TP: common rows load, the live extra rows stay as they were."""
    section, name = key.split(".", 1)
    manager = CheckpointManager(tmp_path, keep_last=1)
    saved = torch.arange(saved_rows * 3, dtype=torch.float32).reshape(saved_rows, 3)
    manager.save(1, {section: {name: saved, "bias": torch.ones(3)}}, {})
    live = torch.full((live_rows, 3), -1.0)
    target = {section: {name: live, "bias": torch.zeros(3)}}
    manager.load(tmp_path / "step_1", target, lambda s: None)
    rows = min(saved_rows, live_rows)
    assert target[section][name] is live
    assert torch.equal(live[:rows], saved[:rows])
    assert torch.equal(live[rows:], torch.full((live_rows - rows, 3), -1.0))
    assert torch.equal(target[section]["bias"], torch.ones(3))


@pytest.mark.parametrize("key", ["model.output.weight", "optim.state.tok_embeddings.weight.exp_avg_sq"])
def test_rows_the_checkpoint_lacks_take_the_mean_of_its_padding_rows(tmp_path, key):
    """Vocabulary 4 saved padded to 6 rows, loaded padded to 9: rows 6-8 are the mean of saved rows 4-5."""
    section, name = key.split(".", 1)
    manager = CheckpointManager(tmp_path, keep_last=1, vocab_size=4)
    saved = torch.arange(18, dtype=torch.float32).reshape(6, 3)
    manager.save(1, {section: {name: saved}}, {})
    live = torch.full((9, 3), -1.0)
    manager.load(tmp_path / "step_1", {section: {name: live}}, lambda s: None)
    assert torch.equal(live[:6], saved)
    assert torch.equal(live[6:], torch.tensor([[13.5, 14.5, 15.5]]).expand(3, 3))


def test_without_saved_padding_rows_the_new_rows_keep_their_values(tmp_path):
    manager = CheckpointManager(tmp_path, keep_last=1, vocab_size=6)
    saved = torch.ones(6, 3)
    manager.save(1, {"model": {"output.weight": saved}}, {})
    live = torch.full((8, 3), -1.0)
    manager.load(tmp_path / "step_1", {"model": {"output.weight": live}}, lambda s: None)
    assert torch.equal(live, torch.cat([saved, torch.full((2, 3), -1.0)]))


def layers(count: int, positions: int = 8) -> dict:
    weights = {f"layers.{i}.w": torch.full((2, 2), float(i)) for i in range(count)}
    return {"model": {"pos_embeddings.weight": torch.zeros(positions, 2), **weights}}


@pytest.mark.parametrize(
    "live, message",
    [
        (layers(1), "the checkpoint has model.layers.1.w (shape [2, 2]), the config gives no such tensor"),
        (layers(3), "the checkpoint has no model.layers.2.w, the config gives shape [2, 2]"),
    ],
    ids=["fewer-layers", "more-layers"],
)
def test_load_refuses_another_architecture_naming_the_key(tmp_path, live, message):
    """A dropped or added layer is a config error (only the vocabulary and position tables fit by rows)."""
    manager = CheckpointManager(tmp_path, keep_last=1)
    manager.save(1, layers(2), {})
    applied = []
    with pytest.raises(CheckpointMismatchError) as error:
        manager.load(tmp_path / "step_1", live, applied.append)
    assert str(error.value) == (
        f"checkpoint {tmp_path / 'step_1'} does not fit the config: {message}; "
        "load it with the model settings it was saved with (its run's hparams.yaml)"
    )
    assert applied == []


def test_a_larger_position_table_takes_the_saved_rows_first(tmp_path):
    """model.max_position_embeddings raised to go on at a longer sequence: the saved rows load into
    the first rows, the others keep their initial values (no position past the saved ones was trained)."""
    manager = CheckpointManager(tmp_path, keep_last=1)
    saved = layers(2)
    saved["model"]["pos_embeddings.weight"] = torch.arange(16.0).reshape(8, 2)
    manager.save(1, saved, {})
    live = layers(2, 16)
    live["model"]["pos_embeddings.weight"].fill_(-1.0)
    applied = []
    manager.load(tmp_path / "step_1", live, applied.append)
    table = applied[0]["model"]["pos_embeddings.weight"]
    assert torch.equal(table, torch.cat([torch.arange(16.0).reshape(8, 2), torch.full((8, 2), -1.0)]))


def test_a_mismatch_is_not_damage_and_is_reported_at_once(tmp_path, monkeypatch):
    """No walk back over older checkpoints (each CRC-read), no advice to move them aside."""
    from gptrain.checkpoint import reader as reader_module

    manager = CheckpointManager(tmp_path, keep_last=3)
    for step in (1, 2, 3):
        manager.save(step, layers(2), {})
    checked = []
    real = reader_module.verify_share
    monkeypatch.setattr(
        reader_module, "verify_share", lambda path, *a: checked.append(path.name) or real(path, *a)
    )
    warnings = []
    with pytest.raises(CheckpointMismatchError, match="step_3 does not fit the config: .*model.layers.1.w"):
        manager.load_newest_good(lambda saved: layers(1), lambda s: None, warnings.append)
    assert checked == ["step_3"] and warnings == []


def test_save_reports_stall_and_size(tmp_path):
    reports = []
    manager = CheckpointManager(tmp_path, keep_last=1, on_saved=reports.append)
    manager.save(2, state_for(2.0), {})
    (report,) = reports
    assert report.step == 2 and not report.background and report.stall_s > 0
    assert report.bytes == sum(f.stat().st_size for f in (tmp_path / "step_2").iterdir())
    assert (
        report.describe().startswith("saved checkpoint step_2 (") and "training stalled" in report.describe()
    )


def test_async_save_stalls_only_for_staging_and_reports_background_write(tmp_path):
    reports = []
    manager = CheckpointManager(tmp_path, keep_last=2, async_save=True, on_saved=reports.append)
    state = state_for(4.0)
    manager.save(4, state, {})
    manager.wait_for_staging()  # the optimizer's pre-step hook: the copy is taken
    state["model"]["w"].fill_(99.0)
    manager.save(5, state_for(5.0), {})  # waits for step 4 only if it is still writing
    manager.close()
    assert [r.step for r in reports] == [4, 5] and all(r.background for r in reports)
    assert "written in the background in" in reports[0].describe()
    target = state_for(0.0)
    manager.load(tmp_path / "step_4", target, lambda s: None)
    assert torch.equal(target["model"]["w"], torch.full((3, 2), 4.0))


def test_a_save_waited_for_at_once_is_written_in_place_on_cpu(tmp_path):
    """The run's last save (or the one before a stop) gains nothing from a staging copy on CPU:
    it is on disk and marked complete when save() returns, after the background save before it."""
    reports = []
    manager = CheckpointManager(tmp_path, keep_last=3, async_save=True, on_saved=reports.append)
    manager.save(1, state_for(1.0), {})
    assert manager.writing
    state = state_for(2.0)
    path = manager.save(2, state, {}, waited_for=True)
    assert not manager.writing and is_complete(path)
    assert (tmp_path / LATEST).read_text().strip() == "step_2"
    state["model"]["w"].fill_(99.0)  # no copy pending that this could reach
    assert [(r.step, r.background) for r in reports] == [(1, True), (2, False)]
    assert "in the background" not in reports[1].describe()
    target = state_for(0.0)
    manager.load(path, target, lambda s: None)
    assert torch.equal(target["model"]["w"], torch.full((3, 2), 2.0))
    manager.close()


@pytest.mark.parametrize("async_save", [False, True])
def test_failed_write_removes_partial_checkpoint_and_keeps_latest(tmp_path, monkeypatch, async_save):
    """A full disk mid-save: one-line error naming the path and cause; earlier checkpoints intact."""
    import errno

    from torch.distributed.checkpoint.filesystem import FileSystemWriter

    from gptrain.checkpoint.errors import CheckpointWriteError

    manager = CheckpointManager(tmp_path, keep_last=3, async_save=async_save)
    manager.save(1, state_for(1.0), {})
    manager.wait()

    def disk_full(self, *args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(FileSystemWriter, "write_data", disk_full)
    with pytest.raises(CheckpointWriteError) as failure:
        manager.save(2, state_for(2.0), {})
        manager.wait()
    message = str(failure.value)
    assert "step_2" in message and "No space left on device" in message and "\n" not in message
    assert not (tmp_path / "step_2").exists()
    assert complete_steps(tmp_path) == [1] and (tmp_path / LATEST).read_text().strip() == "step_1"


def test_space_warning_when_the_disk_cannot_hold_keep_plus_one(tmp_path, monkeypatch):
    import shutil as sh
    from collections import namedtuple

    manager = CheckpointManager(tmp_path / "not" / "yet" / "there", keep_last=2)
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(sh, "disk_usage", lambda path: usage(100e9, 50e9, 50e9))
    assert manager.space_warning(10_000_000_000) is None  # 3 x 10 GB fit in 50 GB
    warning = manager.space_warning(20_000_000_000)
    assert warning.startswith(f"{tmp_path} has 50.0 GB free") and "need 60.0 GB" in warning


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="per-thread nice values are Linux's")
@pytest.mark.parametrize("async_save, waited_for", [(False, False), (True, False), (True, True)])
def test_only_a_background_write_runs_at_low_priority(tmp_path, monkeypatch, async_save, waited_for):
    """The background writer thread runs at nice 19, below training's threads; a synchronous save,
    or one waited for at once on CPU (written in place), is written by the training thread itself
    and never changes that thread's priority."""
    import os
    import threading

    from gptrain.checkpoint import checksum_writer

    def own_nice() -> int:
        return os.getpriority(os.PRIO_PROCESS, threading.get_native_id())

    training_nice = own_nice()
    seen = []
    create_stream = checksum_writer._ChecksummingFileSystem.create_stream

    def recording(self, path, mode):
        seen.append(own_nice())
        return create_stream(self, path, mode)

    monkeypatch.setattr(checksum_writer._ChecksummingFileSystem, "create_stream", recording)
    manager = CheckpointManager(tmp_path, keep_last=1, async_save=async_save)
    manager.save(1, state_for(1.0), {}, waited_for=waited_for)
    manager.close()
    in_background = async_save and not waited_for
    assert seen and set(seen) == {checksum_writer.BACKGROUND_NICE if in_background else training_nice}
    assert own_nice() == training_nice


def test_async_save_is_marked_complete_as_soon_as_written_and_reported_on_poll(tmp_path):
    """Rank 0 marks a background save in a thread of its own (no stall for the manifest's reads);
    the report still reaches the training thread, from poll()."""
    import threading
    import time

    reports = []
    manager = CheckpointManager(
        tmp_path, keep_last=2, async_save=True, on_saved=lambda r: reports.append((r, threading.get_ident()))
    )
    manager.save(6, state_for(6.0), {})
    deadline = time.monotonic() + 60

    def latest() -> str | None:  # written after COMPLETE (and after COMPLETE's directory is fsynced)
        return (tmp_path / LATEST).read_text().strip() if (tmp_path / LATEST).is_file() else None

    while latest() != "step_6" and time.monotonic() < deadline:
        time.sleep(0.01)  # nobody polls: the markers come by themselves
    assert latest() == "step_6"
    assert newest_complete(tmp_path) == tmp_path / "step_6"
    assert reports == []  # reported only from the training thread
    while not reports and time.monotonic() < deadline:
        manager.poll()
    ((report, thread),) = reports
    assert thread == threading.get_ident() and report.step == 6 and report.write_s > 0
    assert report.bytes == sum(f.stat().st_size for f in (tmp_path / "step_6").iterdir())


def test_async_marking_failure_is_raised_on_wait_and_leaves_no_checkpoint(tmp_path, monkeypatch):
    from gptrain.checkpoint import save_manifest
    from gptrain.checkpoint.errors import CheckpointWriteError

    manager = CheckpointManager(tmp_path, keep_last=3, async_save=True)
    manager.save(1, state_for(1.0), {})
    manager.wait()

    def unreadable(path, own, world_size):
        raise OSError(f"{path}: stale file handle")

    monkeypatch.setattr(save_manifest, "gathered_checksums", unreadable)
    manager.save(2, state_for(2.0), {})
    with pytest.raises(CheckpointWriteError, match="step_2 could not be written .*stale file handle"):
        manager.wait()
    assert not (tmp_path / "step_2").exists()
    assert complete_steps(tmp_path) == [1] and (tmp_path / LATEST).read_text().strip() == "step_1"


def refuse_latest_over_quota(monkeypatch) -> None:
    """From then on every write of `latest` fails as over a disk quota (EDQUOT); the steps' own files don't."""
    from gptrain.checkpoint import manager as manager_module

    real = manager_module.atomic_write_text

    def quota_on_latest(path, text):
        if path.name == LATEST:
            raise OSError(122, "Disk quota exceeded")
        real(path, text)

    monkeypatch.setattr(manager_module, "atomic_write_text", quota_on_latest)


@pytest.mark.parametrize("async_save", [False, True])
def test_a_failure_after_the_marker_keeps_the_complete_checkpoint(tmp_path, monkeypatch, async_save):
    """`latest` (or pruning) failing after COMPLETE was written: the checkpoint is sound and stays."""
    from gptrain.checkpoint.errors import CheckpointWriteError

    manager = CheckpointManager(tmp_path, keep_last=3, async_save=async_save)
    manager.save(1, state_for(1.0), {})
    manager.wait()
    refuse_latest_over_quota(monkeypatch)
    with pytest.raises(CheckpointWriteError) as failure:
        manager.save(2, state_for(2.0), {})
        manager.wait()
    assert str(failure.value).startswith(f"checkpoint {tmp_path / 'step_2'} was saved, but updating ")
    assert "Disk quota exceeded" in str(failure.value) and "\n" not in str(failure.value)
    assert complete_steps(tmp_path) == [1, 2] and newest_complete(tmp_path) == tmp_path / "step_2"
    target = state_for(0.0)
    manager.load(tmp_path / "step_2", target, lambda s: None)
    assert torch.equal(target["model"]["w"], torch.full((3, 2), 2.0))


def test_a_run_failing_after_a_background_save_was_marked_does_not_call_it_incomplete(tmp_path, monkeypatch):
    """A run failing by an exception while its background save's `latest` could not be written (COMPLETE
    was): the run's last line said the checkpoint was 'left incomplete' and that resume takes an older
    one, while resume takes this one. It says what `wait` says of it: saved, `latest` not updated."""
    manager = CheckpointManager(tmp_path, keep_last=3, async_save=True)
    refuse_latest_over_quota(monkeypatch)
    manager.save(2, state_for(2.0), {})
    note = manager.finish_after_failure(timeout_s=120)
    assert note.startswith(f"checkpoint {tmp_path / 'step_2'} was saved, but updating ") and "\n" not in note
    assert "Disk quota exceeded" in note and "incomplete" not in note
    assert newest_complete(tmp_path) == tmp_path / "step_2"


@pytest.mark.parametrize(
    ("version", "one_save"),
    [
        ("2.11.0+cu130", True),
        ("2.12.0a0+git1234", True),
        ("2.13.0+cpu", False),
        ("2.14.1", False),
        ("3.0.0", False),
    ],
)
def test_a_stager_is_made_per_save_where_torch_empties_it_after_one(version: str, one_save: bool) -> None:
    """The suite's async tests run two or more saves through one manager, which fails on torch 2.11
    and 2.12 unless each save gets its own stager; here the version rule itself."""
    from gptrain.checkpoint.staging import _stager_serves_one_save

    assert _stager_serves_one_save(version) is one_save


def test_async_saves_fill_the_staging_buffer_prepared_ahead(tmp_path, monkeypatch):
    """On CUDA the buffer is pinned host memory, allocated in the background before the first save
    (pinning is the slow part); here the same path runs with unpinned host memory."""
    import threading

    from torch.distributed._state_dict_utils import _create_cpu_state_dict

    from gptrain.checkpoint import manager as manager_module

    allocations = []

    def allocate(state):
        allocations.append(threading.current_thread().name)
        return _create_cpu_state_dict(state)

    monkeypatch.setattr(manager_module, "allocate_pinned_staging", allocate)
    manager = CheckpointManager(tmp_path, keep_last=3, async_save=True, pinned_staging=True)
    manager.prepare_staging(state_for(0.0))
    manager.wait()  # also waits for the buffer being prepared
    buffer = manager._stager.state_dict_cache
    assert allocations == ["gptrain-pin-staging"] and buffer is not None
    for step in (4, 5):
        state = state_for(float(step))
        manager.save(step, state, {})
        manager.wait_for_staging()
        state["model"]["w"].fill_(99.0)  # training goes on; the save has its copy
        manager.wait()
        assert manager._stager.state_dict_cache is buffer  # filled again, never reallocated
        target = state_for(0.0)
        manager.load(tmp_path / f"step_{step}", target, lambda s: None)
        assert torch.equal(target["model"]["w"], torch.full((3, 2), float(step)))
    manager.prepare_staging(state_for(0.0))  # the buffer exists: nothing more is allocated
    manager.close()
    assert allocations == ["gptrain-pin-staging"]


def test_prepare_staging_does_nothing_for_synchronous_saves_or_without_pinned_staging(tmp_path):
    for pinned, async_save in ((True, False), (False, True)):
        manager = CheckpointManager(
            tmp_path / f"{pinned}-{async_save}", 1, async_save=async_save, pinned_staging=pinned
        )
        manager.prepare_staging(state_for(1.0))
        assert manager._preparing is None


@pytest.mark.parametrize("async_save", [False, True])
def test_a_full_disk_is_named_as_such(tmp_path, monkeypatch, async_save):
    """torch's zip writer raises its own RuntimeError ('unexpected pos ...') while handling the
    OSError beneath: the message names the OSError, ENOSPC, not the zip writer's complaint."""
    import errno

    from gptrain.checkpoint import direct_io
    from gptrain.checkpoint.errors import CheckpointWriteError

    real_write, written = direct_io.SyncedFile.write, []

    def full(self, data):  # the disk fills after the zip's first records
        if sum(written) > 1000:
            raise OSError(errno.ENOSPC, "No space left on device")
        written.append(real_write(self, data))
        return written[-1]

    monkeypatch.setattr(direct_io.SyncedFile, "write", full)
    manager = CheckpointManager(tmp_path, keep_last=3, async_save=async_save, direct_io=False)
    with pytest.raises(
        CheckpointWriteError, match=r"step_1 could not be written \(OSError: \[Errno 28\] No space"
    ):
        manager.save(1, {"model": {"w": torch.zeros(256, 256)}}, {})
        manager.wait()
    assert not (tmp_path / "step_1").exists()


@pytest.mark.parametrize("async_save", [False, True])
def test_a_partial_directory_that_could_not_be_removed_is_said_to_remain(tmp_path, monkeypatch, async_save):
    """The line said "the partial directory was removed" whatever its removal did (ignore_errors):
    it says the directory remains, and why, beside the write's own error."""
    import errno
    import os

    from gptrain.checkpoint import direct_io
    from gptrain.checkpoint.errors import CheckpointWriteError

    def full(self, data):
        raise OSError(errno.ENOSPC, "No space left on device")

    def refuse(path, *args, **kwargs):  # as a directory not ours to write to, even to root
        raise PermissionError(errno.EACCES, "Permission denied", str(path))

    monkeypatch.setattr(direct_io.SyncedFile, "write", full)
    monkeypatch.setattr(os, "rmdir", refuse)  # shutil.rmtree's last call, on the emptied directory
    manager = CheckpointManager(tmp_path, keep_last=3, async_save=async_save, direct_io=False)
    with pytest.raises(CheckpointWriteError) as caught:
        manager.save(1, {"model": {"w": torch.zeros(256, 256)}}, {})
        manager.wait()
    message = str(caught.value)
    assert (tmp_path / "step_1").is_dir()
    assert message.startswith(
        f"checkpoint {tmp_path / 'step_1'} could not be written (OSError: [Errno 28] No space"
    )
    assert (
        f"; the partial directory could not be removed ({tmp_path / 'step_1'}: Permission denied): remove it by "
        "hand; earlier checkpoints are unchanged" in message
    )
    assert "was removed" not in message


def test_space_warning_counts_existing_checkpoints_only_where_retention_removes_them(tmp_path, monkeypatch):
    """save_top_k=-1 (gptrain megatron's default) removes no checkpoint: a resumed run's existing ones
    were counted as free space, so a disk that holds one more checkpoint, not two, was not warned of."""
    import shutil as sh
    from collections import namedtuple

    save_steps(CheckpointManager(tmp_path, keep_last=-1), [1])
    size = json_bytes(tmp_path / "step_1")
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(sh, "disk_usage", lambda path: usage(100 * size, 10 * size, 3 * size // 2))
    warning = CheckpointManager(tmp_path, keep_last=-1).space_warning(size)
    assert warning is not None and "save_top_k=-1 removes none" in warning
    # keeping one, the next save is written beside the existing one, which is then removed: 1.5 fit
    assert CheckpointManager(tmp_path, keep_last=1).space_warning(size) is None


def json_bytes(step_dir) -> int:
    """A checkpoint's size as its COMPLETE manifest records it, the marker included."""
    import json

    record = (step_dir / COMPLETE).read_text()
    return sum(entry["bytes"] for entry in json.loads(record)["files"].values()) + len(record.encode())


def test_space_warning_when_the_next_save_does_not_fit_beside_more_checkpoints_than_kept(
    tmp_path, monkeypatch
):
    """A run resumed with a lower save_top_k (3 checkpoints, 1 kept): all 3 were counted as free
    space, but the next save is written before retention removes any, so a disk with room for half
    a checkpoint was not warned of."""
    import shutil as sh
    from collections import namedtuple

    save_steps(CheckpointManager(tmp_path, keep_last=5), [1, 2, 3])
    size = json_bytes(tmp_path / "step_1")
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(sh, "disk_usage", lambda path: usage(100 * size, 10 * size, size // 2))
    warning = CheckpointManager(tmp_path, keep_last=1).space_warning(size)
    assert warning is not None and warning.startswith(f"{tmp_path} has ") and "free space" in warning
    monkeypatch.setattr(sh, "disk_usage", lambda path: usage(100 * size, 10 * size, 3 * size // 2))
    assert CheckpointManager(tmp_path, keep_last=1).space_warning(size) is None


def test_a_checkpoint_its_run_removes_while_another_loads_it_is_named_so(tmp_path, monkeypatch):
    """`gptrain eval` (or a start from another run's checkpoint) while that run trains on: its next
    save's retention unlinks COMPLETE, then the files. The failed read said the checkpoint was
    damaged; it now says it was removed while read. One that is still complete stays damaged."""
    from gptrain.checkpoint import compat
    from gptrain.checkpoint.directory import CheckpointLoadError
    from gptrain.checkpoint.errors import CheckpointDamagedError

    save_steps(CheckpointManager(tmp_path, keep_last=None), [2])
    step_dir, read_metadata = tmp_path / "step_2", compat.read_metadata

    def pruned_after_reading(path):
        metadata = read_metadata(path)
        (step_dir / COMPLETE).unlink()
        for shard in step_dir.glob("*.distcp"):
            shard.unlink()
        return metadata

    monkeypatch.setattr(compat, "read_metadata", pruned_after_reading)
    reader = CheckpointManager(tmp_path, keep_last=None)
    with pytest.raises(
        CheckpointLoadError, match=f"^checkpoint {step_dir} was removed while it was read"
    ) as error:
        reader.load_verified(step_dir, lambda saved: state_for(0.0), lambda state: None)
    assert not isinstance(error.value, CheckpointDamagedError) and "save_top_k" in str(error.value)

    save_steps(CheckpointManager(tmp_path, keep_last=None), [4])
    monkeypatch.setattr(compat, "read_metadata", read_metadata)
    for shard in (tmp_path / "step_4").glob("*.distcp"):  # same size, bytes that do not unpickle
        shard.write_bytes(b"X" * shard.stat().st_size)
    files = json.loads((tmp_path / "step_4" / COMPLETE).read_text())
    for entry in files["files"].values():
        entry["crc32"] = None  # as before CRC-32s were recorded: only the load finds the damage
    (tmp_path / "step_4" / COMPLETE).write_text(json.dumps(files))
    with pytest.raises(CheckpointDamagedError, match="step_4 is damaged"):
        reader.load_verified(tmp_path / "step_4", lambda saved: state_for(0.0), lambda state: None)


def test_a_save_over_the_same_step_killed_while_it_removes_the_old_one_leaves_no_complete_marker(
    tmp_path, monkeypatch
):
    """A requeued run saving again the step it already holds removes the old directory first; a
    kill midway left a COMPLETE marker over a directory missing some of its files (only resume's
    verification caught it). The marker goes first now, as retention's does."""
    import gptrain.checkpoint.manager as manager_module

    manager = CheckpointManager(tmp_path, keep_last=3)
    path = manager.save(5, state_for(5.0), {"rng": torch.tensor([5])})

    def killed_after_one_file(directory, *args, **kwargs):
        next(p for p in sorted(directory.iterdir()) if p.name != COMPLETE).unlink()
        raise KeyboardInterrupt  # the job killed mid-removal

    monkeypatch.setattr(manager_module.shutil, "rmtree", killed_after_one_file)
    with pytest.raises(KeyboardInterrupt):
        manager.save(5, state_for(6.0), {"rng": torch.tensor([6])})
    assert not is_complete(path)


def test_a_save_removes_the_latest_temporaries_a_killed_run_left(tmp_path, capsys):
    """A kill while `latest` was written left `.latest.XXXXXXXX.tmp` in checkpoints/, which nothing removed.
    The next save removes those untouched for an hour (rank 0 writes `latest` in milliseconds) and says
    so; a younger one, and another file's temporary, stay."""
    import os
    import time

    tmp_path.mkdir(exist_ok=True)
    old, young, other = (
        tmp_path / name for name in (".latest.a1b2c3d4.tmp", ".latest.e5f6g7h8.tmp", ".notes.a1b2c3d4.tmp")
    )
    for path in (old, young, other):
        path.write_text("step_")
    two_hours_ago = time.time() - 7200
    for path in (old, other):
        os.utime(path, (two_hours_ago, two_hours_ago))
    save_steps(CheckpointManager(tmp_path, keep_last=3), [1])
    assert not old.exists() and young.exists() and other.exists()
    assert (tmp_path / LATEST).read_text() == "step_1\n"
    assert (
        f"gptrain: removed .latest.a1b2c3d4.tmp from {tmp_path}: left unfinished by a run killed while writing latest\n"
        in capsys.readouterr().err
    )


@pytest.mark.parametrize("async_save", [False, True])
def test_a_save_whose_other_ranks_files_rank_0_cannot_see_is_never_marked_complete(
    tmp_path, monkeypatch, async_save
):
    """Node-local storage under one path on each node: rank 0 listed only its own node's files and
    marked a checkpoint of half the shards COMPLETE; the resume then passed over every checkpoint as
    damaged, or, requeued on other nodes, started over. Here a world of 2 whose rank 1 wrote nowhere
    rank 0 can see."""
    from gptrain.checkpoint import manager as manager_module
    from gptrain.checkpoint.errors import CheckpointNotSharedError

    manager = CheckpointManager(tmp_path, keep_last=3, async_save=async_save)
    manager.save(1, state_for(1.0), {})
    manager.wait()
    monkeypatch.setattr(manager_module, "saving_world_size", lambda: 2)
    with pytest.raises(CheckpointNotSharedError) as failure:
        manager.save(2, state_for(2.0), {})
        manager.wait()
    message = str(failure.value)
    assert message.startswith(f"checkpoint {tmp_path / 'step_2'} was not marked complete: rank 0 cannot see")
    assert "(.checksums.rank1.json)" in message and "\n" not in message
    assert "exp_manager.explicit_log_dir" in message and "free space" not in message
    assert not (tmp_path / "step_2").exists()
    assert complete_steps(tmp_path) == [1] and (tmp_path / LATEST).read_text().strip() == "step_1"


def fake_step_dir(step_dir: Path, world_size: int) -> dict[str, dict]:
    """A step directory as `world_size` ranks leave it (a DCP shard, a rank file and a checksum sidecar
    each, and .metadata); returns the manifest it must get, sizes distinct per file."""
    step_dir.mkdir()
    expected = {".metadata": {"bytes": 3, "crc32": "0000abcd"}}
    (step_dir / ".metadata").write_bytes(b"abc")
    for rank in range(world_size):
        own = {
            f"__{rank}_0.distcp": (rank + 1, f"{rank:08x}"),
            f"rank_{rank}.pt": (rank + 7, f"{rank + 1:08x}"),
        }
        for name, (size, crc) in own.items():
            (step_dir / name).write_bytes(b"x" * size)
            expected[name] = {"bytes": size, "crc32": crc}
        sidecar = json.dumps({name: crc for name, (_, crc) in own.items()}) + "\n"
        (step_dir / f".checksums.rank{rank}.json").write_text(sidecar)
        expected[f".checksums.rank{rank}.json"] = {"bytes": len(sidecar), "crc32": None}
    return expected


def count_file_system_calls(monkeypatch, directory: Path) -> tuple[dict[str, int], list[str]]:
    """Count os.stat/os.lstat calls per file of `directory`, and record every listing of it."""
    import os
    from collections import Counter

    stats: Counter = Counter()
    listings: list[str] = []

    def counted(real, kind):
        def call(path=".", *args, **kwargs):
            if isinstance(path, (str, os.PathLike)):
                target = Path(path)
                if kind == "stat" and target.parent == directory:
                    stats[target.name] += 1
                elif kind == "list" and target == directory:
                    listings.append(real.__name__)
            return real(path, *args, **kwargs)

        return call

    for name, kind in [("stat", "stat"), ("lstat", "stat"), ("scandir", "list"), ("listdir", "list")]:
        monkeypatch.setattr(os, name, counted(getattr(os, name), kind))
    return stats, listings


def test_rank_0_marks_a_save_of_many_ranks_complete_with_one_stat_a_file_and_no_listing(
    tmp_path, monkeypatch
):
    """Rank 0 stat'ed every rank's sidecar and files to see them, then listed the step directory and
    stat'ed each file twice more for the manifest (8,197 -> 11,333 stats at 1,024 ranks), in a
    synchronous save's stall."""
    from gptrain.checkpoint import manager as manager_module
    from gptrain.checkpoint.save_report import SaveReport

    world = 64
    manager = CheckpointManager(tmp_path, keep_last=3)
    step_dir = tmp_path / "step_5"
    expected = fake_step_dir(step_dir, world)
    monkeypatch.setattr(manager_module, "saving_world_size", lambda: world)
    stats, listings = count_file_system_calls(monkeypatch, step_dir)
    manager._mark_complete(SaveReport(5, step_dir, 0.0, 0.0, False), {".metadata": "0000abcd"})
    monkeypatch.undo()
    assert listings == []
    assert {name: stats[name] for name in expected} == dict.fromkeys(expected, 1)  # COMPLETE's own aside
    record = json.loads((step_dir / COMPLETE).read_text())
    assert record["files"] == expected and list(record["files"]) == sorted(expected)
    assert (tmp_path / LATEST).read_text() == "step_5\n"


def test_the_files_rank_0_cannot_find_by_name_are_named_sidecars_first(tmp_path, monkeypatch):
    from gptrain.checkpoint import manager as manager_module
    from gptrain.checkpoint.errors import CheckpointNotSharedError
    from gptrain.checkpoint.save_report import SaveReport

    manager = CheckpointManager(tmp_path, keep_last=3)
    step_dir = tmp_path / "step_5"
    fake_step_dir(step_dir, 4)
    (step_dir / ".checksums.rank3.json").unlink()  # rank 3's node: none of its files here
    (step_dir / "rank_2.pt").unlink()
    monkeypatch.setattr(manager_module, "saving_world_size", lambda: 4)
    with pytest.raises(CheckpointNotSharedError, match=r"\(.checksums.rank3.json, rank_2.pt\)"):
        manager._mark_complete(SaveReport(5, step_dir, 0.0, 0.0, False), {".metadata": "0000abcd"})
    assert not (step_dir / COMPLETE).exists() and not (tmp_path / LATEST).exists()


def test_a_background_save_given_up_by_a_failing_run_is_named_by_its_own_cause(tmp_path, monkeypatch):
    """The save's error was raised inside the run's own failure (the `finally` that gives the save its
    time), so it took the run's error as its context, and the note named that one: after a lost peer,
    'left incomplete (GptrainError: rank 0: a collective lost its peer ...)', the line before it again."""
    from concurrent.futures import Future

    from gptrain.checkpoint import manager as manager_module
    from gptrain.errors import GptrainError

    def collective_lost_its_peer(*args, **kwargs) -> Future:
        upload: Future = Future()
        upload.set_exception(RuntimeError("Connection closed by peer [127.0.0.1]:29500"))
        return upload

    manager = CheckpointManager(tmp_path, keep_last=3, async_save=True)
    monkeypatch.setattr(manager_module.dcp, "async_save", collective_lost_its_peer)
    manager.save(2, state_for(2.0), {})
    with pytest.raises(GptrainError):
        try:
            raise GptrainError("rank 0: a collective lost its peer at iteration 3")
        finally:
            note = manager.finish_after_failure(timeout_s=120)
    assert note == (
        "checkpoint step_2 left incomplete (RuntimeError: Connection closed by peer [127.0.0.1]:29500); "
        "resume uses the newest complete one"
    )


def test_a_failed_runs_save_rank_0_has_not_marked_is_said_on_the_other_ranks(tmp_path, monkeypatch):
    """On a failed run's way out, a rank other than 0 reports a background save only where it reads
    rank 0's COMPLETE; rank 0 still marking it, the logging rank (the last) said nothing at all of a
    checkpoint that then was complete (review J). It waits a few seconds for the marker, then says."""
    from gptrain.checkpoint import save_failures

    monkeypatch.setattr(save_failures, "MARK_WAIT_S", 0.3)
    reports = []
    manager = CheckpointManager(tmp_path, keep_last=3, async_save=True, on_saved=reports.append)
    manager.rank = 1  # this rank writes its shards; rank 0, not here, marks the step
    manager.save(2, state_for(2.0), {})
    note = manager.finish_after_failure(timeout_s=120)
    assert reports == [] and not is_complete(tmp_path / "step_2")
    assert note == (
        f"checkpoint {tmp_path / 'step_2'} was written on this rank but rank 0 had not marked it complete"
        f" after 0 s; resume takes it only if its {COMPLETE} marker is there"
    )


def test_a_failed_runs_save_rank_0_marks_while_another_rank_waits_is_reported_there(tmp_path, monkeypatch):
    from gptrain.checkpoint import save_failures

    reports = []
    manager = CheckpointManager(tmp_path, keep_last=3, async_save=True, on_saved=reports.append)
    manager.rank = 1
    waited = []
    monkeypatch.setattr(
        save_failures, "marked_within", lambda path, timeout_s: waited.append(timeout_s) or True
    )
    manager.save(2, state_for(2.0), {})
    assert manager.finish_after_failure(timeout_s=120) is None
    assert [r.step for r in reports] == [2] and waited == [save_failures.MARK_WAIT_S]
