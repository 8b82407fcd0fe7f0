"""A kill inside a save over a step symlink (pruning.put_in_place) left `.step_N.replacing` and
`.step_N.replaced-link`, which nothing read: the resume took an older step, or started from scratch, and
the save's disk leaked (review Z). The resume now puts the save (or the link) back first."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from gptrain.checkpoint.integrity import COMPLETE, complete_steps, verify
from gptrain.checkpoint.manager import CheckpointManager
from gptrain.checkpoint.replace_recovery import recover_replaced_links

REPO = Path(__file__).resolve().parents[2]


def save(manager, step, value):
    manager.save(step, {"model": {"w": torch.full((2,), value)}}, {"rng": torch.tensor([step])})


def other_run(tmp_path):
    """Another run's step_4 (w = 4.0), and its files."""
    other = tmp_path / "other" / "checkpoints"
    manager = CheckpointManager(other, keep_last=-1)
    save(manager, 4, 4.0)
    manager.close()
    return other, sorted(p.name for p in (other / "step_4").iterdir())


def own_save(tmp_path):
    """A complete save of step 4 (w = 40.0) of this run, to build `.step_4.replacing` from."""
    own = tmp_path / "own"
    manager = CheckpointManager(own, keep_last=-1)
    save(manager, 4, 40.0)
    manager.close()
    return own / "step_4"


def resumed_w(run):
    """The step a resume loads, and its w."""
    loaded = {}
    manager = CheckpointManager(run, keep_last=-1)
    found = manager.load_newest_good(
        lambda saved: {"model": {"w": torch.zeros(2)}}, lambda state: loaded.update(state), print
    )
    return (found[0].name, loaded["model"]["w"][0].item()) if found else None


def entries(run):
    return sorted(p.name for p in run.iterdir())


# what a kill left: step_4 (none, the link, the run's own save), the aside link, `.step_4.replacing`
STATES = {
    "between the renames": (None, True, "complete", "own"),
    "between the renames, replacing incomplete": (None, True, "incomplete", "link"),
    "between the renames, replacing gone": (None, True, None, "link"),
    "after the renames": ("own", True, None, "own"),
    "before the first rename": ("link", False, "complete", "link"),
    "while writing": ("link", False, "incomplete", "link"),
    "link gone, save complete": (None, False, "complete", "own"),
    "link gone, save incomplete": (None, False, "incomplete", None),
}


@pytest.mark.parametrize("state", STATES)
def test_each_state_a_kill_leaves_is_put_right_before_the_resume(tmp_path, state, capsys):
    step, aside, replacing, resumed = STATES[state]
    other, files = other_run(tmp_path)
    own = own_save(tmp_path)
    run = tmp_path / "run" / "checkpoints"
    run.mkdir(parents=True)
    if step == "link":
        (run / "step_4").symlink_to(other / "step_4")
    elif step == "own":
        own.rename(run / "step_4")
        own = own_save(tmp_path)
    if aside:
        (run / ".step_4.replaced-link").symlink_to(other / "step_4")
    if replacing is not None:
        own.rename(run / ".step_4.replacing")
        if replacing == "incomplete":
            (run / ".step_4.replacing" / COMPLETE).unlink()
    (run / "latest").write_text("step_4\n")
    capsys.readouterr()

    expected = {"own": ("step_4", 40.0), "link": ("step_4", 4.0), None: None}[resumed]
    assert resumed_w(run) == expected
    assert entries(run) == (["latest", "step_4"] if resumed else ["latest"])
    assert (run / "step_4").is_symlink() == (resumed == "link")
    if resumed == "own":
        assert verify(run / "step_4", checksums=True) is None and complete_steps(run) == [4]
    assert sorted(p.name for p in (other / "step_4").iterdir()) == files  # never through the link
    err = capsys.readouterr().err
    actions = [line for line in err.splitlines() if line.startswith("gptrain: ")]
    assert len(actions) == int(aside) + (replacing is not None), err  # one line for each action
    assert recover_replaced_links(run) == []  # once


KILLED = {
    "rename .step_4.replacing": ("rename", ".step_4.replacing", 40.0),  # between the renames
    "rename step_4": ("rename", "step_4", 4.0),  # before the first
    "unlink .step_4.replaced-link": ("unlink", ".step_4.replaced-link", 40.0),  # after both
}

CRASH = """
import os, sys, torch
from pathlib import Path
from gptrain.checkpoint import pruning
from gptrain.checkpoint.manager import CheckpointManager
run, call, name = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
real = getattr(os, call)
def killed(path, *args, **kwargs):
    if Path(path).name == name:
        os._exit(137)  # SIGKILL: no cleanup runs
    return real(path, *args, **kwargs)
setattr(pruning.os, call, killed)
manager = CheckpointManager(run, keep_last=-1)
manager.save(4, {"model": {"w": torch.full((2,), 40.0)}}, {"rng": torch.tensor([4])})
"""


@pytest.mark.parametrize("killed", KILLED)
def test_a_save_over_a_linked_step_killed_at_each_rename_resumes_from_step_4(tmp_path, killed, capsys):
    call, name, w = KILLED[killed]
    other, files = other_run(tmp_path)
    run = tmp_path / "run" / "checkpoints"
    run.mkdir(parents=True)
    (run / "step_4").symlink_to(other / "step_4")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, "-c", CRASH, str(run), call, name], env=env, timeout=120)
    assert done.returncode == 137
    assert any(p.name.startswith(".step_4.") for p in run.iterdir())

    assert resumed_w(run) == ("step_4", w)
    assert [p.name for p in run.iterdir() if p.name.startswith(".")] == []
    assert sorted(p.name for p in (other / "step_4").iterdir()) == files


def test_a_run_whose_only_step_a_kill_hid_resumes_it_rather_than_the_checkpoint_to_start_from(tmp_path):
    """exp_manager.resume_from_checkpoint is used while the run has no checkpoint of its own: a kill
    between the renames hid its only one, so a requeued job started over from the source."""
    from gptrain.config import load_training_config
    from gptrain.train.resuming import checkpoint_to_start_from

    other, _ = other_run(tmp_path)
    run = tmp_path / "run" / "checkpoints"
    run.mkdir(parents=True)
    (run / ".step_4.replaced-link").symlink_to(other / "step_4")
    own_save(tmp_path).rename(run / ".step_4.replacing")
    overrides = [
        f"exp_manager.explicit_log_dir={run.parent}",
        f"exp_manager.resume_from_checkpoint={other / 'step_4'}",
    ]
    assert checkpoint_to_start_from(load_training_config("gpt3/126m", overrides)) is None
    assert entries(run) == ["step_4"] and not (run / "step_4").is_symlink()


@pytest.mark.parametrize("async_save", [False, True])
def test_a_save_whose_link_cannot_be_put_back_is_kept_for_the_resume(tmp_path, monkeypatch, async_save):
    """The save could not be renamed over the link, nor the link back: the line said earlier checkpoints
    were unchanged and the complete save was removed; both are kept now, and the resume loads the save."""
    from gptrain.checkpoint import pruning
    from gptrain.checkpoint.errors import CheckpointWriteError

    other, files = other_run(tmp_path)
    run = tmp_path / "run" / "checkpoints"
    run.mkdir(parents=True)
    (run / "step_4").symlink_to(other / "step_4")
    rename = os.rename

    def failing_rename(source, target):
        if Path(source).name in (".step_4.replacing", ".step_4.replaced-link"):
            raise OSError(5, "Input/output error (injected)")
        return rename(source, target)

    monkeypatch.setattr(pruning.os, "rename", failing_rename)
    with pytest.raises(CheckpointWriteError) as raised:
        manager = CheckpointManager(run, keep_last=-1, async_save=async_save)
        save(manager, 4, 40.0)
        manager.wait()
    text = str(raised.value)
    assert "the next resume puts the save in place" in text and "unchanged" not in text, text
    assert "the save: Input/output error (injected); putting the link back: Input/output error (" in text, (
        text
    )
    monkeypatch.undo()
    assert resumed_w(run) == ("step_4", 40.0)
    assert entries(run) == ["latest", "step_4"]
    assert sorted(p.name for p in (other / "step_4").iterdir()) == files
