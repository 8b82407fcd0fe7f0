"""A run directory moved (or an import copied elsewhere): its hparams.yaml still names the old
explicit_log_dir, where training would have started from scratch."""

import shutil

import pytest
from train_e2e_helpers import MOCK, log_lines, run_recording, tiny_config

from gptrain.cli import main

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")

SHORT = [*MOCK, "trainer.max_steps=2", "trainer.limit_val_batches=0", "model.num_layers=1"]


def test_a_moved_run_is_refused_where_it_would_start_from_scratch(tmp_path, monkeypatch, capsys):
    old, moved = tmp_path / "old", tmp_path / "moved"
    assert run_recording(monkeypatch, tiny_config(old, *SHORT))[0] == 0
    shutil.move(old, moved)
    config = ["train", "--config-file", str(moved / "hparams.yaml"), "trainer.max_steps=3"]
    assert main(config) == 2
    error = capsys.readouterr().err.strip()
    assert error.startswith(
        f"gptrain: error: {moved / 'hparams.yaml'}: exp_manager.explicit_log_dir is {old}"
    )
    assert f"add exp_manager.explicit_log_dir={moved} to continue it" in error
    assert len(error.splitlines()) == 1
    assert not old.exists()  # nothing written at the old place
    assert main([*config, f"exp_manager.explicit_log_dir={moved}"]) == 0
    assert any(
        line.startswith("resuming from ") and "step_2 at iteration 2" in line for line in log_lines(moved)
    )
    assert main([*config, f"exp_manager.explicit_log_dir={tmp_path / 'new'}"]) == 0  # a config as template


def test_a_moved_run_that_started_from_another_checkpoint_is_refused(tmp_path, monkeypatch, capsys):
    """A run started from another run's checkpoint (resume_from_checkpoint, relative as typed)
    records that path in its hparams.yaml. Moved, it went back to that starting point at its old
    place, its own checkpoints ignored. Only a resume_from_checkpoint given on the command line
    is a choice that overrides the moved-run check."""
    monkeypatch.chdir(tmp_path)
    source, old, moved = tmp_path / "source", tmp_path / "old", tmp_path / "moved"
    assert run_recording(monkeypatch, tiny_config(source, *SHORT))[0] == 0
    start = ["exp_manager.resume_from_checkpoint=source", "trainer.max_steps=4"]
    assert run_recording(monkeypatch, tiny_config(old, *SHORT, *start))[0] == 0
    shutil.move(old, moved)
    monkeypatch.chdir(moved)  # the recorded path no longer names anything from here, as typed
    config = ["train", "--config-file", str(moved / "hparams.yaml"), "trainer.max_steps=5"]
    assert main(config) == 2
    error = capsys.readouterr().err.strip()
    assert f"exp_manager.explicit_log_dir is {old}" in error and len(error.splitlines()) == 1
    assert f"add exp_manager.explicit_log_dir={moved} to continue it" in error
    assert not old.exists()
    assert main([*config, f"exp_manager.resume_from_checkpoint={source}"]) == 0  # a choice made now
    assert any(line.startswith(f"starting from {source}/checkpoints/step_2") for line in log_lines(old))
    assert main([*config, f"exp_manager.explicit_log_dir={moved}"]) == 0
    assert any(
        line.startswith("resuming from ") and "step_4 at iteration 4" in line for line in log_lines(moved)
    )


def test_a_run_with_a_relative_log_dir_given_from_another_directory_is_told_where_it_started(
    tmp_path, monkeypatch, capsys
):
    """A run started in `start` with explicit_log_dir=runs/a, continued from another directory: it
    was not moved, but the refusal said it was, and named the relative path resolved from here as
    the file's value. It now says where the run was started, to run from there."""
    start, elsewhere = tmp_path / "start", tmp_path / "elsewhere"
    start.mkdir()
    elsewhere.mkdir()
    monkeypatch.chdir(start)
    assert run_recording(monkeypatch, tiny_config("runs/a", *SHORT))[0] == 0
    run = start / "runs" / "a"
    monkeypatch.chdir(elsewhere)
    config = ["train", "--config-file", str(run / "hparams.yaml"), "trainer.max_steps=3"]
    assert main(config) == 2
    error = capsys.readouterr().err.strip()
    assert error.startswith(
        f"gptrain: error: {run / 'hparams.yaml'}: exp_manager.explicit_log_dir is runs/a, relative to the "
        f"directory the run was started in ({start}); from here it names {elsewhere / 'runs' / 'a'}"
    )
    assert f"run from {start} to continue the run" in error and len(error.splitlines()) == 1
    assert "moved" not in error and not (elsewhere / "runs").exists()
    monkeypatch.chdir(start)
    assert main(config) == 0
    assert any(
        line.startswith("resuming from ") and "step_2 at iteration 2" in line for line in log_lines(run)
    )
