"""`gptrain checkpoint rewind RUN --to step_N`: back to an earlier checkpoint of the same run, the newer
ones kept aside, a resume then going on from step_N bit for bit."""

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from gptrain.checkpoint.integrity import complete_steps, verify
from gptrain.checkpoint.manager import CheckpointManager
from gptrain.cli import main
from gptrain.train.run_directory import claim_run_directory
from gptrain.train.run_lock import acquire

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "train"))
from train_e2e_helpers import (  # noqa: E402
    MOCK,
    Preempted,
    log_lines,
    preempted_at_the_test_split,
    run_recording,
    tiny_config,
)

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")


def run_with_checkpoints(run: Path, steps: list[int]) -> Path:
    """A run directory whose checkpoints/ holds complete step_<N> for each of `steps`."""
    manager = CheckpointManager(run / "checkpoints", keep_last=None)
    for step in steps:
        manager.save(step, {"model": {"w": torch.full((8, 8), float(step))}}, {})
    manager.close()
    return run / "checkpoints"


def aside(root: Path) -> list[str]:
    return sorted(p.name.split(".")[0] for p in root.iterdir() if ".rewound-" in p.name)


def test_rewind_moves_the_newer_checkpoints_aside_and_points_latest(tmp_path, capsys):
    root = run_with_checkpoints(tmp_path, [2, 4, 6, 8])
    assert main(["checkpoint", "rewind", str(tmp_path), "--to", "step_4"]) == 0
    assert complete_steps(root) == [2, 4]
    assert (root / "latest").read_text().strip() == "step_4"
    assert aside(root) == ["step_6", "step_8"]
    for moved in root.glob("step_*.rewound-*"):
        assert verify(moved, checksums=True) is None  # kept whole, never deleted
    out = capsys.readouterr().out
    assert "moved step_8 aside to step_8.rewound-" in out and "moved step_6 aside" in out
    assert "rewound to step_4 (2 newer checkpoints moved aside)" in out
    assert "step_6.rewound-" in out and "set aside" not in out
    assert main(["checkpoint", "verify", str(tmp_path)]) == 0
    listed = [line for line in capsys.readouterr().out.splitlines() if "rewound-" in line]
    assert len(listed) == 2 and all("set aside by `gptrain checkpoint rewind`" in line for line in listed)


@pytest.mark.parametrize(
    ("where", "given"),
    [
        (".", "run"),
        (".", "run/checkpoints"),
        ("run/checkpoints/step_2", ".."),
        ("run/checkpoints/step_2", "../.."),
    ],
)
def test_a_run_given_relative_to_the_working_directory_is_rewound(
    tmp_path, monkeypatch, capsys, where, given
):
    """`gptrain checkpoint rewind run --to 2` from the directory holding the run (no dirpath): refused
    with "run/checkpoints/hparams.yaml names the run directory run relative to where the run was
    started", a file that does not exist, and nothing rewound. `rewind .. --to 2` from inside step_2
    took the lock in step_2 (the `..` kept), so a live run's lock was not seen and it was rewound under
    that run. Refused while the run is live, rewound once it ended, the lock taken in the run directory."""
    root = run_with_checkpoints(tmp_path / "run", [2, 4])
    monkeypatch.chdir(tmp_path / where)
    live = acquire(tmp_path / "run")
    try:
        assert main(["checkpoint", "rewind", given, "--to", "2"]) == 2
    finally:
        live.release()
    assert "is in use by a live run (pid" in capsys.readouterr().err
    assert complete_steps(root) == [2, 4] and aside(root) == []
    assert main(["checkpoint", "rewind", given, "--to", "2"]) == 0, capsys.readouterr().err
    assert complete_steps(root) == [2] and aside(root) == ["step_4"]
    assert not list(tmp_path.rglob("gptrain.lock"))


def test_dot_dot_from_a_symlinked_checkpoints_directory_takes_the_runs_lock(tmp_path, monkeypatch, capsys):
    """run/checkpoints a symlink to scratch: `rewind .. --to 2` from the shell's run/checkpoints/step_2
    (the process's working directory is scratch's step_2) took scratch's parent for the run directory
    and missed the live run's lock in run/."""
    root = run_with_checkpoints(tmp_path / "scratch", [2, 4])
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "checkpoints").symlink_to(root)
    monkeypatch.chdir(tmp_path / "run" / "checkpoints" / "step_2")
    monkeypatch.setenv("PWD", str(tmp_path / "run" / "checkpoints" / "step_2"))  # as the shell's cd sets it
    live = acquire(tmp_path / "run")
    try:
        assert main(["checkpoint", "rewind", "..", "--to", "2"]) == 2
    finally:
        live.release()
    assert "is in use by a live run (pid" in capsys.readouterr().err
    assert complete_steps(root) == [2, 4] and not list(tmp_path.rglob("gptrain.lock"))


def test_a_checkpoints_directory_a_live_run_locks_apart_is_not_rewound_under_it(tmp_path, capsys):
    """run/checkpoints a symlink to scratch/ck: the live run locks run/ and scratch/ck (its checkpoints
    resolve outside its log dir), but `rewind scratch/ck` locked only scratch/, and rewound under it."""
    root = run_with_checkpoints(tmp_path / "scratch", [2, 4])
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "checkpoints").symlink_to(root)
    live = claim_run_directory(tmp_path / "run", 0, 1, resume=True, move_aside=False)
    try:
        assert main(["checkpoint", "rewind", str(root), "--to", "2"]) == 2
    finally:
        live.release()
    err = capsys.readouterr().err
    assert (
        err.startswith(f"gptrain: error: {root} is in use by a live run (pid") and len(err.splitlines()) == 1
    )
    assert complete_steps(root) == [2, 4] and not list(tmp_path.rglob("gptrain.lock"))
    assert main(["checkpoint", "rewind", str(root), "--to", "2"]) == 0
    assert complete_steps(root) == [2] and not list(tmp_path.rglob("gptrain.lock"))


def test_retention_ignores_rewound_checkpoints(tmp_path):
    root = run_with_checkpoints(tmp_path, [2, 4, 6])
    assert main(["checkpoint", "rewind", str(root), "--to", "2"]) == 0
    manager = CheckpointManager(root, keep_last=1)  # save_top_k=1
    manager.save(4, {"model": {"w": torch.zeros(8, 8)}}, {})
    manager.close()
    assert complete_steps(root) == [4] and aside(root) == ["step_4", "step_6"]


def test_a_live_run_an_unknown_step_or_a_damaged_one_is_refused_and_nothing_moves(tmp_path, capsys):
    root = run_with_checkpoints(tmp_path, [2, 4, 6])
    lock = acquire(tmp_path)  # a live run: this process holds the lock
    try:
        assert main(["checkpoint", "rewind", str(tmp_path), "--to", "step_4"]) == 2
    finally:
        lock.release()
    err = capsys.readouterr().err
    assert "is in use by a live run (pid" in err and "stop it" in err and len(err.splitlines()) == 1
    assert main(["checkpoint", "rewind", str(tmp_path), "--to", "step_3"]) == 2
    err = capsys.readouterr().err
    assert "step_3 is not a complete checkpoint of this run (complete: step_2, step_4, step_6)" in err
    shard = next((root / "step_4").glob("*.distcp"))
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF
    shard.write_bytes(bytes(data))
    assert main(["checkpoint", "rewind", str(tmp_path), "--to", "step_4"]) == 2
    err = capsys.readouterr().err
    assert "step_4 is damaged" in err and "nothing was rewound" in err
    assert complete_steps(root) == [2, 4, 6] and (root / "latest").read_text().strip() == "step_6"
    assert not (tmp_path / "gptrain.lock").exists()


def test_a_rewind_cut_short_leaves_a_sound_newest_checkpoint_and_the_same_command_finishes(
    tmp_path, monkeypatch, capsys
):
    """`latest` moves first and the newest goes first: killed between two renames, the newest complete
    checkpoint is a sound one, and `latest` never names a moved one."""
    root = run_with_checkpoints(tmp_path, [2, 4, 6, 8])
    renames = []
    real_rename = Path.rename

    def rename_once(path, target):
        if renames:
            raise OSError(28, "No space left on device")
        renames.append(path.name)
        return real_rename(path, target)

    monkeypatch.setattr(Path, "rename", rename_once)
    assert main(["checkpoint", "rewind", str(tmp_path), "--to", "step_4"]) == 2
    assert "run the same command again" in capsys.readouterr().err
    assert renames == ["step_8"] and complete_steps(root) == [2, 4, 6]
    assert (root / "latest").read_text().strip() == "step_4"
    assert verify(root / "step_6", checksums=True) is None
    monkeypatch.setattr(Path, "rename", real_rename)
    assert main(["checkpoint", "rewind", str(tmp_path), "--to", "step_4"]) == 0
    assert complete_steps(root) == [2, 4] and aside(root) == ["step_6", "step_8"]


def test_a_step_directory_or_a_file_given_for_the_run_is_one_line_saying_what_rewind_takes(tmp_path, capsys):
    """`rewind RUN/checkpoints/step_4` (verify takes a step directory) said no step directories were found
    in it, and a file was told to pass a step directory, which rewind refuses; both name what it takes."""
    import shlex

    root = run_with_checkpoints(tmp_path / "my run", [2, 4, 6])
    assert main(["checkpoint", "rewind", str(root / "step_4"), "--to", "4"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"gptrain: error: {root / 'step_4'}: one checkpoint, where rewind takes its run")
    command = shlex.split(err.rpartition("`gptrain")[2].rstrip("`"))
    assert command == ["checkpoint", "rewind", str(root), "--to", "step_4"] and len(err.splitlines()) == 1
    assert main(["checkpoint", "rewind", *command[2:]]) == 0
    assert complete_steps(root) == [2, 4]
    capsys.readouterr()
    (tmp_path / "notes").write_text("")
    assert main(["checkpoint", "rewind", str(tmp_path / "notes"), "--to", "4"]) == 2
    err = capsys.readouterr().err
    assert (
        "not a directory; pass a run directory or its checkpoints/" in err and "step_<N> directory" not in err
    )


def test_rewind_imports_no_torch(tmp_path):
    run_with_checkpoints(tmp_path, [2, 4])
    code = (
        "import sys; from gptrain.cli import main; "
        f"code = main(['checkpoint', 'rewind', {str(tmp_path)!r}, '--to', 'step_2']); "
        "print(code, 'torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split()[-2:] == ["0", "False"], out.stdout + out.stderr


def test_resume_after_a_rewind_repeats_the_uninterrupted_steps_bit_for_bit(tmp_path, monkeypatch):
    """Train to 6 saving every 2, rewind to 4, resume: steps 5 and 6 have the uninterrupted run's
    losses exactly (the data position and the LR schedule of step 4)."""
    keep_all = [
        *MOCK,
        "exp_manager.checkpoint_callback_params.every_n_train_steps=2",
        "exp_manager.checkpoint_callback_params.save_top_k=-1",
    ]
    code, full = run_recording(monkeypatch, tiny_config(tmp_path, *keep_all))
    assert code == 0 and sorted(full) == [1, 2, 3, 4, 5, 6]
    step_4 = tmp_path / "checkpoints" / "step_4"
    megatron_habit = tiny_config(tmp_path, *keep_all, f"exp_manager.resume_from_checkpoint={step_4}")
    assert run_recording(monkeypatch, megatron_habit) == (0, {})  # resumes step_6, and says how to go back
    hint = f"to go back to it, `gptrain checkpoint rewind {tmp_path} --to step_4`"
    assert any(line.endswith(hint) for line in log_lines(tmp_path))
    assert main(["checkpoint", "rewind", str(tmp_path), "--to", "step_4"]) == 0
    code, again = run_recording(monkeypatch, tiny_config(tmp_path, *keep_all))
    assert code == 0 and sorted(again) == [5, 6]
    assert again[5] == full[5] and again[6] == full[6]  # bit for bit, not approx
    assert any(
        line.startswith("resuming from ") and "step_4 at iteration 4" in line for line in log_lines(tmp_path)
    )
    assert complete_steps(tmp_path / "checkpoints") == [2, 4, 6]


def test_a_rewound_run_stopped_before_its_test_split_evaluates_it_when_resumed(tmp_path, monkeypatch):
    """The first trajectory's record of its test split at step 6 outlived the rewind: the second
    trajectory, stopped between its own step_6 save and its test split, was then never tested (a
    resume at max_steps said 'nothing to do'). A run that trains now forgets the record first."""
    from gptrain.train.results import TEST_DONE

    keep = [*MOCK, "exp_manager.checkpoint_callback_params.every_n_train_steps=2"]
    keep += ["exp_manager.checkpoint_callback_params.save_top_k=-1"]
    assert run_recording(monkeypatch, tiny_config(tmp_path, *keep))[0] == 0
    assert (tmp_path / TEST_DONE).read_text() == "6\n"
    assert main(["checkpoint", "rewind", str(tmp_path), "--to", "step_4"]) == 0
    preempted_at_the_test_split(monkeypatch)
    with pytest.raises(Preempted):
        run_recording(monkeypatch, tiny_config(tmp_path, *keep, "model.optim.lr=0.01"))
    monkeypatch.undo()
    assert not (tmp_path / TEST_DONE).exists()
    tested_before = sum(" on test set |" in line for line in log_lines(tmp_path))
    assert run_recording(monkeypatch, tiny_config(tmp_path, *keep, "model.optim.lr=0.01")) == (0, {})
    assert any(
        "evaluating the test split, which the run stopped before" in line for line in log_lines(tmp_path)
    )
    assert sum(" on test set |" in line for line in log_lines(tmp_path)) == tested_before + 1
    assert (tmp_path / TEST_DONE).read_text() == "6\n"


def test_the_rewind_hint_quotes_a_run_directory_with_spaces_and_to_takes_a_step_path(tmp_path):
    """The hint's command was pasted unquoted (a run dir with a space broke it), and `--to` refused the
    step directory's path that tab completion gives."""
    import shlex

    from gptrain.checkpoint.rewind import target_step
    from gptrain.train.resuming import unused_start_from_text

    run = tmp_path / "my run; x"
    root = run_with_checkpoints(run, [2, 4])
    command = unused_start_from_text(str(root / "step_2"), root).rpartition("`gptrain")[2].rstrip("`")
    assert shlex.split("gptrain" + command) == ["gptrain", "checkpoint", "rewind", str(run), "--to", "step_2"]
    assert target_step(f"{root}/step_2/", root) == 2 and target_step("step_2", root) == 2
    assert target_step("4", root) == 4
    other = run_with_checkpoints(tmp_path / "other", [2])
    assert main(["checkpoint", "rewind", str(run), "--to", str(other / "step_2")]) == 2
    assert complete_steps(root) == [2, 4]  # another run's step_2 did not rewind this one to its own
    (root / "step_6").symlink_to(other / "step_2", target_is_directory=True)  # a step kept on other storage
    assert target_step(str(root / "step_6"), root) == 6  # its own step, though the link leads elsewhere
