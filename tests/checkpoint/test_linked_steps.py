"""A step directory that is a symlink (to another run's step_N: a continuation set up by hand, storage
tiering linking old checkpoints back) is this run's only as a link: retention, a torn save's cleanup and
a save over the same step remove the link, never anything through it (review C25 F1)."""

import os
from pathlib import Path

import pytest
import torch

from gptrain.checkpoint.errors import CheckpointWriteError
from gptrain.checkpoint.integrity import COMPLETE, complete_steps, verify
from gptrain.checkpoint.manager import CheckpointManager


def save(manager, step):
    manager.save(step, {"model": {"w": torch.full((2,), float(step))}}, {"rng": torch.tensor([step])})


def other_run(tmp_path, steps=(2,)):
    """Another run's checkpoints directory, keeping every checkpoint, and its files by step."""
    other = tmp_path / "other" / "checkpoints"
    manager = CheckpointManager(other, keep_last=-1)
    for step in steps:
        save(manager, step)
    manager.close()
    return other, {step: sorted(p.name for p in (other / f"step_{step}").iterdir()) for step in steps}


def run_linking(tmp_path, other, step):
    """This run's checkpoints directory, whose step_<step> is a symlink to the other run's."""
    run = tmp_path / "run" / "checkpoints"
    run.mkdir(parents=True)
    (run / f"step_{step}").symlink_to(other / f"step_{step}")
    return run


def test_retention_unlinks_a_linked_step_and_leaves_its_target_whole(tmp_path):
    other, files = other_run(tmp_path)
    run = run_linking(tmp_path, other, 2)
    lines = []
    manager = CheckpointManager(run, keep_last=1, on_saved=lambda report: lines.append(report.describe()))
    save(manager, 4)
    manager.close()
    assert not (run / "step_2").exists() and not (run / "step_2").is_symlink()
    assert sorted(p.name for p in (other / "step_2").iterdir()) == files[2]
    assert verify(other / "step_2", checksums=True) is None
    assert lines[0].endswith(
        f"; unlinked step_2 (not among the 1 newest; a symlink to {other / 'step_2'}: its target was left alone)"
    )
    assert complete_steps(run) == [4]


def test_a_linked_torn_step_loses_only_the_link(tmp_path):
    other, files = other_run(tmp_path)
    (other / "step_2" / COMPLETE).unlink()  # torn there, as the other run's own cleanup may find it
    run = run_linking(tmp_path, other, 2)
    manager = CheckpointManager(run, keep_last=-1)
    save(manager, 4)
    manager.close()
    assert not (run / "step_2").is_symlink()
    assert sorted(p.name for p in (other / "step_2").iterdir()) == [n for n in files[2] if n != COMPLETE]


@pytest.mark.parametrize("async_save", [False, True])
def test_a_save_over_a_linked_step_writes_its_own_and_leaves_the_target_whole(tmp_path, async_save):
    """The save is written under a temporary name beside the link, which it replaces once every file
    is on disk; COMPLETE goes in last. The save's line says the link went and its target stayed."""
    other, files = other_run(tmp_path, steps=(4,))
    run = run_linking(tmp_path, other, 4)
    lines = []
    manager = CheckpointManager(
        run, keep_last=-1, async_save=async_save, on_saved=lambda report: lines.append(report.describe())
    )
    manager.save(4, {"model": {"w": torch.full((2,), 9.0)}}, {"rng": torch.tensor([9])})
    manager.close()
    assert not (run / "step_4").is_symlink() and complete_steps(run) == [4]
    assert sorted(p.name for p in run.iterdir()) == ["latest", "step_4"]  # no temporary name left
    assert verify(run / "step_4", checksums=True) is None
    assert sorted(p.name for p in (other / "step_4").iterdir()) == files[4]
    assert verify(other / "step_4", checksums=True) is None
    assert len(lines) == 1 and lines[0].endswith(
        f"; replaced the symlink step_4 (to {other / 'step_4'}) with this run's own step_4: its target was"
        " left alone"
    )
    loaded = CheckpointManager(run, keep_last=-1).read_state(run / "step_4", {"model": {"w": torch.zeros(2)}})
    assert loaded["model"]["w"].tolist() == [9.0, 9.0]  # this run's, not the other's 4.0


def test_a_save_over_a_linked_step_that_fails_keeps_the_link(tmp_path, monkeypatch):
    """Unlinked before the write, a save that failed half way left neither the link nor a checkpoint
    of the step: a resume from the other run's checkpoint lost it."""
    import torch.distributed.checkpoint as dcp

    other, files = other_run(tmp_path, steps=(4,))
    run = run_linking(tmp_path, other, 4)
    manager = CheckpointManager(run, keep_last=-1)

    def full_disk(state, checkpoint_id, **kwargs):
        (Path(checkpoint_id) / "__0_0.distcp").write_bytes(b"partial")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(dcp, "save", full_disk)
    with pytest.raises(CheckpointWriteError):
        save(manager, 4)
    assert (run / "step_4").is_symlink() and complete_steps(run) == [4]
    assert sorted(p.name for p in run.iterdir()) == ["step_4"]
    assert sorted(p.name for p in (other / "step_4").iterdir()) == files[4]
    assert verify(other / "step_4", checksums=True) is None


def test_the_loss_a_stop_left_due_is_not_written_into_a_linked_step(tmp_path):
    other, _ = other_run(tmp_path)
    marker = (other / "step_2" / COMPLETE).read_text()
    run = run_linking(tmp_path, other, 2)
    manager = CheckpointManager(run, keep_last=-1)
    manager.load_newest_good(lambda saved: {"model": {"w": torch.zeros(2)}}, lambda state: None, print)
    assert manager.resumed == run / "step_2"
    assert manager.record_metrics_of_resumed(2, {"val_loss": 0.5}) is None
    assert (other / "step_2" / COMPLETE).read_text() == marker


def test_a_removal_that_fails_says_so_in_one_line(tmp_path, monkeypatch, capsys):
    run = tmp_path / "checkpoints"
    manager = CheckpointManager(run, keep_last=1)
    save(manager, 1)

    def refuse(path, *args, **kwargs):  # as a directory not ours to write to, even to root
        raise PermissionError(13, "Permission denied", str(path))

    monkeypatch.setattr(os, "rmdir", refuse)  # shutil.rmtree's last call, on the emptied directory
    save(manager, 2)
    manager.close()
    err = capsys.readouterr().err
    assert f"could not remove {run / 'step_1'} (" in err and "Permission denied" in err
    assert len([line for line in err.splitlines() if "could not remove" in line]) == 1


def test_a_linked_steps_bytes_are_not_counted_as_space_retention_frees(tmp_path, monkeypatch):
    """Unlinking frees nothing: a disk that holds the next checkpoints only with the target's bytes
    counted in is warned about (it was not: the target counted as space retention would free)."""
    import shutil
    from collections import namedtuple

    from gptrain.checkpoint.pruning import step_dir_bytes

    other, _ = other_run(tmp_path)
    run = run_linking(tmp_path, other, 2)
    manager = CheckpointManager(run, keep_last=1)
    linked, count = step_dir_bytes(run / "step_2"), manager._on_disk_at_prune()
    free = 1000 * linked
    size = (free + linked // 2) // count  # count x size: more than free, less than free + linked
    monkeypatch.setattr(shutil, "disk_usage", lambda path: namedtuple("usage", "total used free")(0, 0, free))
    warning = manager.space_warning(size)
    manager.close()
    assert warning is not None and f"need {count * size / 1e9:.1f} GB" in warning


def run_linking_within(tmp_path, link, target, keep_last):
    """This run's checkpoints directory, whose step_<link> is a symlink to its own step_<target>
    (`ln -s step_2 step_6`), and a manager keeping `keep_last`, its save lines collected in `lines`."""
    run = tmp_path / "checkpoints"
    manager = CheckpointManager(run, keep_last=-1)
    save(manager, target)
    manager.close()
    (run / f"step_{link}").symlink_to(f"step_{target}")
    lines = []
    manager = CheckpointManager(
        run, keep_last=keep_last, on_saved=lambda report: lines.append(report.describe())
    )
    return run, manager, lines


def test_a_kept_link_keeps_its_target_in_the_same_run(tmp_path):
    """keep_last=2 keeps the link step_6 among the newest: its target step_2 stays with it (it was
    removed, leaving the kept checkpoint dangling: review X F2)."""
    run, manager, lines = run_linking_within(tmp_path, 6, 2, keep_last=2)
    save(manager, 8)
    manager.close()
    assert (run / "step_6").is_symlink() and verify(run / "step_6", checksums=True) is None
    assert complete_steps(run) == [2, 6, 8]
    assert "removed" not in lines[0] and "unlinked" not in lines[0]


def test_a_kept_link_keeps_every_link_of_the_run_its_chain_passes(tmp_path):
    """step_6 -> step_4 -> step_2: unlinking step_4 left the kept step_6 dangling (review X F4)."""
    run, manager, lines = run_linking_within(tmp_path, 4, 2, keep_last=2)
    (run / "step_6").symlink_to("step_4")
    save(manager, 8)
    manager.close()
    assert (run / "step_4").is_symlink() and verify(run / "step_6", checksums=True) is None
    assert complete_steps(run) == [2, 4, 6, 8] and "unlinked" not in lines[0]


def test_a_link_removed_with_its_target_in_the_same_run_says_so(tmp_path):
    run, manager, lines = run_linking_within(tmp_path, 6, 2, keep_last=1)
    save(manager, 8)
    manager.close()
    assert not (run / "step_6").is_symlink() and not (run / "step_2").exists()
    assert complete_steps(run) == [8]
    assert "left alone" not in lines[0]
    assert lines[0].endswith(
        "; removed step_2 (not among the 1 newest); unlinked step_6 (not among the 1 newest; a symlink to "
        "step_2, this run's step_2, which is removed as well)"
    )


def test_a_torn_link_removed_with_its_torn_target_in_the_same_run_says_so(tmp_path, capsys):
    run, manager, _ = run_linking_within(tmp_path, 6, 2, keep_last=-1)
    (run / "step_2" / COMPLETE).unlink()
    save(manager, 8)
    manager.close()
    assert not (run / "step_6").is_symlink() and not (run / "step_2").exists()
    err = capsys.readouterr().err
    assert "left alone" not in err
    assert (
        "unlinked step_6 (incomplete; a symlink to step_2, this run's step_2, which is removed as well)"
        in err
    )


def test_a_link_unlinked_beside_a_kept_link_to_the_same_target_says_it_was_left_alone(tmp_path):
    run, manager, lines = run_linking_within(tmp_path, 6, 2, keep_last=2)
    (run / "step_5").symlink_to("step_2")
    save(manager, 8)
    manager.close()
    assert not (run / "step_5").is_symlink() and complete_steps(run) == [2, 6, 8]
    assert lines[0].endswith(
        "; unlinked step_5 (not among the 2 newest; a symlink to step_2: its target was left alone)"
    )


def test_a_save_over_a_dangling_step_link_names_the_link_and_keeps_it(tmp_path):
    """A step symlink whose target is gone (another run's retention, or a filesystem not mounted on this
    node) stops the save naming the link and its target: it was told "a file of that name is in the way"."""
    run = tmp_path / "run" / "checkpoints"
    run.mkdir(parents=True)
    (run / "step_4").symlink_to(tmp_path / "unmounted" / "step_4")
    manager = CheckpointManager(run, keep_last=-1)
    with pytest.raises(CheckpointWriteError) as raised:
        save(manager, 4)
    assert str(raised.value) == (
        f"checkpoint {run / 'step_4'} cannot be saved: it is a symlink to {tmp_path / 'unmounted' / 'step_4'}, "
        "which does not exist (is its filesystem mounted on this node?); remove the link or restore its "
        "target, then run the same command again"
    )
    assert (run / "step_4").is_symlink()


def test_two_ranks_save_over_a_linked_step_into_one_directory_of_their_own(tmp_path):
    """Every rank writes beside the link, under the name rank 0 cleared; rank 0 puts it in place."""
    import json

    from gloo_ranks import run_ranks

    other, files = other_run(tmp_path, steps=(4,))
    runs = []
    for async_save in (False, True):
        run = run_linking(tmp_path / f"async_{async_save}", other, 4)
        runs.append([str(run), async_save])
    run_ranks(Path(__file__).with_name("linked_step_worker.py"), json.dumps(runs))
    for run, _ in runs:
        step = Path(run) / "step_4"
        assert not step.is_symlink() and verify(step, checksums=True) is None
        assert {"rank_0.pt", "rank_1.pt"} <= {p.name for p in step.iterdir()}
        assert sorted(p.name for p in Path(run).iterdir()) == ["latest", "step_4"]
    assert sorted(p.name for p in (other / "step_4").iterdir()) == files[4]
    assert verify(other / "step_4", checksums=True) is None


@pytest.mark.parametrize("failing", ["COMPLETE", "rename"])
def test_a_save_over_a_linked_step_that_cannot_be_marked_or_put_in_place_keeps_the_link(
    tmp_path, monkeypatch, failing
):
    """The link was replaced before COMPLETE was written: a full disk under the marker then removed the
    save the link had become, and the run's directory lost both, its line saying earlier checkpoints
    were unchanged (review X2)."""
    from gptrain.checkpoint import manager as manager_module
    from gptrain.checkpoint import pruning

    other, files = other_run(tmp_path, steps=(4,))
    run = run_linking(tmp_path, other, 4)
    manager = CheckpointManager(run, keep_last=-1)
    write_text, rename = manager_module.atomic_write_text, os.rename

    def full_under_complete(path, text):
        if failing == "COMPLETE" and path.name == COMPLETE:
            raise OSError(28, "No space left on device (injected)")
        return write_text(path, text)

    def failing_rename(source, target):
        if failing == "rename" and Path(source).name == ".step_4.replacing":
            raise OSError(28, "No space left on device (injected)")
        return rename(source, target)

    monkeypatch.setattr(manager_module, "atomic_write_text", full_under_complete)
    monkeypatch.setattr(pruning.os, "rename", failing_rename)
    with pytest.raises(CheckpointWriteError, match="earlier checkpoints are unchanged"):
        save(manager, 4)
    assert (run / "step_4").is_symlink() and os.readlink(run / "step_4") == str(other / "step_4")
    assert sorted(p.name for p in run.iterdir()) == ["step_4"] and complete_steps(run) == [4]
    assert sorted(p.name for p in (other / "step_4").iterdir()) == files[4]


def test_a_save_over_a_linked_step_whose_old_link_cannot_be_removed_is_saved(tmp_path, monkeypatch, capsys):
    """The link is moved aside, the save renamed into place, then the old link removed: a removal that
    fails leaves the save complete, and says so in one line."""
    from gptrain.checkpoint import pruning

    other, _ = other_run(tmp_path, steps=(4,))
    run = run_linking(tmp_path, other, 4)
    manager = CheckpointManager(run, keep_last=-1)
    unlink = os.unlink

    def failing_unlink(path, *args, **kwargs):
        if Path(path).name.startswith(".step_4."):
            raise PermissionError(13, "Permission denied (injected)")
        return unlink(path, *args, **kwargs)

    monkeypatch.setattr(pruning.os, "unlink", failing_unlink)
    save(manager, 4)
    manager.close()
    assert not (run / "step_4").is_symlink() and complete_steps(run) == [4]
    assert verify(run / "step_4", checksums=True) is None
    err = capsys.readouterr().err
    assert "could not remove the symlink" in err and ".step_4." in err, err


def test_a_rank_on_its_way_out_reports_a_linked_save_only_once_it_is_in_place(tmp_path, monkeypatch):
    """Rank 1 read COMPLETE through the link (the other run's step_4, complete) and reported a save
    rank 0 never marked as saved (review X3)."""
    from gptrain.checkpoint import save_failures
    from gptrain.checkpoint.pruning import replacing_dir
    from gptrain.checkpoint.save_report import SaveReport

    other, _ = other_run(tmp_path, steps=(4,))
    run = run_linking(tmp_path, other, 4)
    monkeypatch.setattr(save_failures, "MARK_WAIT_S", 0.3)
    reported = []
    manager = CheckpointManager(run, keep_last=-1, rank=1, on_saved=reported.append)
    written = replacing_dir(run / "step_4")
    written.mkdir()
    (written / "__1_0.distcp").write_bytes(b"partial")
    report = SaveReport(4, run / "step_4", 0.0, 0.0, True, 0.0, replaced_link=str(other / "step_4"))
    report.written_in = written
    manager._unagreed = [report]
    note = manager.finish_after_failure(1.0)
    assert reported == [] and note is not None and "rank 0 had not marked it complete" in note, note
    error = OSError(28, "No space left on device")
    assert "was saved" not in save_failures.given_up_text(run, report.path, error)
