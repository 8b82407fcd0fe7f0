"""exp_manager.checkpoint_callback_params.dirpath: where NeMo (PyTorch Lightning) saves and resumes
checkpoints; it was ignored, and the checkpoints went to explicit_log_dir/checkpoints."""

import os
from pathlib import Path

import pytest
import yaml
from train_e2e_helpers import MOCK, log_lines, run_recording, tiny_config

from gptrain.checkpoint.cli import checkpoint_root
from gptrain.checkpoint.directory import LATEST, find_checkpoint, run_dir_of
from gptrain.checkpoint.integrity import complete_steps
from gptrain.checkpoint.rewind import rewind
from gptrain.config import load_training_config
from gptrain.errors import EXIT_REQUEUE, ConfigError
from gptrain.launch.preflight import check_fresh_start
from gptrain.train.earlier_run import EarlierRunError
from gptrain.train.run_directory import claim_run_directory
from gptrain.train.run_lock import LOCK_NAME, RunLockedError
from gptrain.trained.load import find_hparams, resolve_checkpoint
from gptrain.trained.run_config import run_started_in

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")

DIRPATH = "exp_manager.checkpoint_callback_params.dirpath"


def test_checkpoints_are_saved_to_and_resumed_from_dirpath(tmp_path, monkeypatch):
    """A stop at 3 saves into dirpath (given relative: against the working directory, as Lightning
    resolves it); the same command resumes from it at 3 and finishes there; nothing goes to
    explicit_log_dir/checkpoints."""
    log_dir, store = tmp_path / "run", tmp_path / "fsx" / "ckpts"
    monkeypatch.chdir(tmp_path)
    cfg = tiny_config(log_dir, *MOCK, f"{DIRPATH}=fsx/ckpts")
    assert cfg.exp_manager.checkpoint_callback_params.dirpath == str(store)
    code, first = run_recording(monkeypatch, cfg, signal_at=3)
    assert code == EXIT_REQUEUE and sorted(first) == [1, 2, 3]
    assert complete_steps(store) == [2, 3] and (store / LATEST).read_text().strip() == "step_3"
    assert not (log_dir / "checkpoints").exists()
    code, second = run_recording(monkeypatch, tiny_config(log_dir, *MOCK, f"{DIRPATH}={store}"))
    assert code == 0 and sorted(second) == [4, 5, 6]
    assert f"resuming from {store / 'step_3'} at iteration 3, consumed samples 12" in log_lines(log_dir)
    assert complete_steps(store) == [4, 6] and (store / LATEST).read_text().strip() == "step_6"
    assert not (log_dir / "checkpoints").exists()
    # the tools given the run directory find the checkpoints, and the run directory from them
    assert find_checkpoint(log_dir) == store / "step_6"
    assert resolve_checkpoint(log_dir) == store / "step_6" and checkpoint_root(log_dir) == store
    assert find_hparams(store / "step_6") == log_dir / "hparams.yaml"  # the run's own, over the copy
    assert run_dir_of(store) == log_dir and (store / "hparams.yaml").is_file()


def test_a_fresh_start_over_dirpaths_checkpoints_is_refused_naming_dirpath(tmp_path, monkeypatch):
    store = tmp_path / "ckpts"
    cfg = tiny_config(tmp_path / "run", *MOCK, f"{DIRPATH}={store}", "trainer.max_steps=2")
    assert run_recording(monkeypatch, cfg)[0] == 0 and complete_steps(store) == [2]
    again = tiny_config(tmp_path / "run", *MOCK, f"{DIRPATH}={store}", "exp_manager.resume_if_exists=false")
    with pytest.raises(EarlierRunError, match=f"resume_if_exists=false but {store} holds an earlier run's"):
        run_recording(monkeypatch, again)
    aside = tiny_config(
        tmp_path / "run", *MOCK, f"{DIRPATH}={store}", "trainer.max_steps=2",
        "exp_manager.resume_if_exists=false", "exp_manager.move_aside_earlier_run=true",
    )  # fmt: skip
    code, losses = run_recording(monkeypatch, aside)
    assert code == 0 and sorted(losses) == [1, 2]
    moved = [p for p in os.listdir(tmp_path) if p.startswith("ckpts.earlier-")]
    assert len(moved) == 1 and complete_steps(tmp_path / moved[0] / "ckpts") == [2]
    assert complete_steps(store) == [2]  # the new run's own


def test_a_run_dir_that_records_a_dirpath_leads_only_there_and_a_fresh_start_beside_old_checkpoints_is_refused(
    tmp_path, monkeypatch
):
    """An earlier run without dirpath left run/checkpoints/step_2; a fresh start with a dirpath was
    admitted beside it, and the tools given the run directory then took the old step_2 over the new
    run's checkpoints in dirpath. The fresh start is refused naming run/checkpoints; a run that
    resumes there saves into dirpath, and the tools find only dirpath's checkpoints."""
    log_dir, store = tmp_path / "run", tmp_path / "ckpts"
    assert run_recording(monkeypatch, tiny_config(log_dir, *MOCK, "trainer.max_steps=2"))[0] == 0
    fresh = [*MOCK, f"{DIRPATH}={store}", "trainer.max_steps=4", "exp_manager.resume_if_exists=false"]
    old = log_dir / "checkpoints"
    with pytest.raises(EarlierRunError, match=f"resume_if_exists=false but {old} holds an earlier run's"):
        run_recording(monkeypatch, tiny_config(log_dir, *fresh))
    with pytest.raises(EarlierRunError, match=f"but {old} holds"):
        check_fresh_start(tiny_config(log_dir, *fresh))  # the launch says it before the queue wait
    code, losses = run_recording(
        monkeypatch, tiny_config(log_dir, *MOCK, f"{DIRPATH}={store}", "trainer.max_steps=4")
    )
    assert code == 0 and sorted(losses) == [1, 2, 3, 4] and complete_steps(store) == [2, 4]
    assert complete_steps(old) == [2]
    assert find_checkpoint(log_dir) == store / "step_4" and resolve_checkpoint(log_dir) == store / "step_4"
    assert checkpoint_root(log_dir) == store


def test_the_copy_in_dirpath_names_the_run_directory_from_any_working_directory(tmp_path, monkeypatch):
    """The hparams.yaml copied into dirpath kept a relative explicit_log_dir: `gptrain checkpoint
    rewind` from another directory locked <cwd>/run (creating it) under a live training, and eval,
    generate and export read relative tokenizer paths against nothing. The copy names the run
    directory absolute, and the tools given a checkpoint there read the run's own hparams.yaml, which
    tells where the run was started."""
    start, store = tmp_path / "start", tmp_path / "ckpts"
    start.mkdir()
    monkeypatch.chdir(start)
    cfg = tiny_config("run", *MOCK, f"{DIRPATH}={store}", "trainer.max_steps=2")
    assert cfg.exp_manager.explicit_log_dir == "run" and run_recording(monkeypatch, cfg)[0] == 0
    monkeypatch.chdir(tmp_path)
    assert run_dir_of(store) == start / "run"
    hparams = find_hparams(store / "step_2")
    assert hparams == start / "run" / "hparams.yaml"
    assert (
        run_started_in(load_training_config(config_file=str(hparams), report_ignored=False), hparams) == start
    )
    assert not (tmp_path / "run").exists()


def test_two_runs_with_other_log_dirs_and_one_dirpath_are_not_both_admitted(tmp_path):
    """Each run locked only its log dir: two runs writing step_N into the same dirpath were both
    admitted. The dirpath outside the log dir is locked too, for the run's life; a move-aside keeps
    the lock where it is."""
    store = tmp_path / "ckpts"
    first = claim_run_directory(tmp_path / "a", 0, 1, resume=True, move_aside=False, checkpoints=store)
    with pytest.raises(RunLockedError, match=str(store)):
        claim_run_directory(tmp_path / "b", 0, 1, resume=True, move_aside=False, checkpoints=store)
    assert not (tmp_path / "b" / LOCK_NAME).exists()  # the refused run left no lock behind
    first.release()
    assert not store.exists()  # made by the run, left empty: removed with the lock
    second = claim_run_directory(tmp_path / "b", 0, 1, resume=True, move_aside=False, checkpoints=store)
    (store / "step_2").mkdir()
    (store / "step_2" / "COMPLETE").touch()
    second.release()
    third = claim_run_directory(tmp_path / "c", 0, 1, resume=False, move_aside=True, checkpoints=store)
    assert (store / LOCK_NAME).is_file() and complete_steps(store) == []
    third.release()
    assert not (store / LOCK_NAME).exists()


def test_a_rewind_through_an_older_copy_with_a_relative_run_directory_is_refused_elsewhere(
    tmp_path, monkeypatch
):
    """A copy written before the run directory was recorded absolute names it relative to where the
    run started: a rewind from elsewhere locked <cwd>/run (creating it) beside the live run. It is
    refused there in one line, and taken from the directory the run started in."""
    start, store = tmp_path / "start", tmp_path / "ckpts"
    start.mkdir()
    monkeypatch.chdir(start)
    cfg = tiny_config("run", *MOCK, f"{DIRPATH}={store}", "trainer.max_steps=4")
    assert run_recording(monkeypatch, cfg)[0] == 0 and complete_steps(store) == [2, 4]
    copy = yaml.safe_load((store / "hparams.yaml").read_text())
    copy["exp_manager"]["explicit_log_dir"] = "run"  # as the copy was written before
    (store / "hparams.yaml").write_text(yaml.safe_dump(copy))
    monkeypatch.chdir(tmp_path)
    with pytest.raises(
        ConfigError, match=r"names the run directory run relative to where the run was started"
    ):
        rewind(store, 2, say=lambda _: None)
    assert not (tmp_path / "run").exists() and complete_steps(store) == [2, 4]
    monkeypatch.chdir(start)
    rewind(store, 2, say=lambda _: None)
    assert complete_steps(store) == [2]


def test_a_dirpath_shared_through_a_symlink_inside_the_log_dir_is_locked(tmp_path):
    """A dirpath inside the log dir as given, but a symlink to another run's dirpath, took no lock of
    its own (the log dir's lock was taken to cover it): both runs were admitted into one directory."""
    store = tmp_path / "ckpts"
    first = claim_run_directory(tmp_path / "a", 0, 1, resume=True, move_aside=False, checkpoints=store)
    (tmp_path / "b").mkdir()
    link = tmp_path / "b" / "checkpoints"
    link.symlink_to(store)
    with pytest.raises(RunLockedError, match=str(store)):
        claim_run_directory(tmp_path / "b", 0, 1, resume=True, move_aside=False, checkpoints=link)
    assert not (tmp_path / "b" / LOCK_NAME).exists()
    first.release()
    inside = tmp_path / "c" / "ckpts"  # a symlink outside the log dir into it: covered by its lock
    inside.mkdir(parents=True)
    (tmp_path / "c-link").symlink_to(inside)
    third = claim_run_directory(
        tmp_path / "c", 0, 1, resume=True, move_aside=False, checkpoints=tmp_path / "c-link"
    )
    assert third.dirpath_lock is None and not (inside / LOCK_NAME).exists()
    third.release()


@pytest.mark.parametrize("first", ["owner", "borrower"])
def test_a_dirpath_inside_another_live_runs_log_dir_is_refused_whichever_starts_first(tmp_path, first):
    """Run a saves into a/checkpoints (its log dir's lock covers it); run b, given
    dirpath=a/checkpoints, locked only that directory, which a never locks: both were admitted, and
    either order saved two runs' step_N into one directory."""
    owner = lambda: claim_run_directory(tmp_path / "a", 0, 1, resume=True, move_aside=False)  # noqa: E731
    shared = tmp_path / "a" / "checkpoints"
    borrower = lambda: claim_run_directory(  # noqa: E731
        tmp_path / "b", 0, 1, resume=True, move_aside=False, checkpoints=shared
    )
    live = (owner if first == "owner" else borrower)()
    with pytest.raises(RunLockedError) as error:
        (borrower if first == "owner" else owner)()
    held = tmp_path / "a" if first == "owner" else shared  # the log dir's lock, or b's dirpath lock
    assert str(error.value).startswith(f"{shared}: another run holds {held} (pid {os.getpid()}")
    assert "\n" not in str(error.value)
    assert not (tmp_path / ("b" if first == "owner" else "a") / LOCK_NAME).exists()  # nothing left behind
    live.release()
    (borrower if first == "owner" else owner)().release()  # once the other run has ended


def test_a_move_aside_under_a_dirpath_symlinked_into_the_log_dir_makes_the_directory_again(tmp_path):
    """A dirpath that is a symlink into the log dir: moving the earlier run aside took the link's
    target with it, and the run then failed making the dangling link a directory ('cannot claim it
    ... File exists'), the earlier run already moved: every rerun failed the same way."""
    inside = tmp_path / "run" / "ckpts"
    (inside / "step_2").mkdir(parents=True)
    (inside / "step_2" / "COMPLETE").touch()
    link = tmp_path / "link"
    link.symlink_to(inside)
    lock = claim_run_directory(tmp_path / "run", 0, 1, resume=False, move_aside=True, checkpoints=link)
    assert "moved the earlier run's" in lock.notes[0]
    assert inside.is_dir() and complete_steps(link) == []  # made again where the link leads
    (aside,) = tmp_path.glob("run.earlier-*")
    assert complete_steps(aside / "ckpts") == [2]
    lock.release()
    assert not inside.exists() and link.is_symlink()  # made by the run, left empty: removed


@pytest.mark.parametrize("first", ["dirpath", "nested"])
def test_a_log_dir_inside_another_live_runs_dirpath_is_refused_whichever_starts_first(tmp_path, first):
    """Run a saves into the dirpath ckpts/ (locked); run b's log dir ckpts/b was admitted inside it
    (only the reverse, a dirpath inside another run's log dir, was refused), so a's move-aside of an
    earlier run took b's live files with it. Refused in one line naming both paths and the holder."""
    store, nested = tmp_path / "ckpts", tmp_path / "ckpts" / "b"
    owner = lambda: claim_run_directory(  # noqa: E731
        tmp_path / "a", 0, 1, resume=True, move_aside=False, checkpoints=store
    )
    inside = lambda: claim_run_directory(nested, 0, 1, resume=True, move_aside=False)  # noqa: E731
    live = (owner if first == "dirpath" else inside)()
    with pytest.raises(RunLockedError) as error:
        (inside if first == "dirpath" else owner)()
    text = str(error.value)
    if first == "dirpath":
        assert text.startswith(f"{nested}: another run holds {store} (pid {os.getpid()}")
    else:
        assert text.startswith(f"{store}: another run holds {nested} (pid {os.getpid()}")
    assert "\n" not in text and "exp_manager.explicit_log_dir" in text
    assert not (nested / LOCK_NAME).exists() if first == "dirpath" else not (store / LOCK_NAME).exists()
    live.release()
    (inside if first == "dirpath" else owner)().release()  # once the other run has ended


def test_a_dirpath_is_searched_for_another_runs_log_dir_only_near_its_top(tmp_path, monkeypatch):
    """The search for a live run's log dir inside a dirpath stops NESTED_RUN_DEPTH levels down and never
    enters step directories: a dirpath set to a broad directory is not walked whole at each start. It
    listed each directory NESTED_RUN_DEPTH down as well, and read a lock in every directory it saw
    (a 20x20x20 tree: 8,421 listings, 8,420 lock reads): now it lists down to one level above and reads
    only the locks it finds there, or by name one level below."""
    from gptrain.train import nested_runs, run_lock

    store = tmp_path / "ckpts"
    deep = store / "a" / "b" / "c" / "run"  # below the depth searched (admitted: its own walk up refuses a)
    (store / "step_2" / "run").mkdir(parents=True)
    inside = [claim_run_directory(deep, 0, 1, resume=True, move_aside=False)]
    inside.append(claim_run_directory(store / "step_2" / "run", 0, 1, resume=True, move_aside=False))
    for name in ("a/b/c0", "a/b/c1", "a/b0/c", "a0"):
        (store / name).mkdir(parents=True)
    (store / "a" / "b" / "c1" / LOCK_NAME).write_text("{}")  # a torn lock, 3 down: read, and no one's
    (store / "a" / LOCK_NAME).write_text("{}")
    listed, read = [], []
    scandir, read_holder = os.scandir, run_lock.read_holder
    monkeypatch.setattr(os, "scandir", lambda path=".": listed.append(Path(path)) or scandir(path))
    monkeypatch.setattr(os, "listdir", lambda path=".": pytest.fail(f"listdir({path})"))
    monkeypatch.setattr(run_lock, "read_holder", lambda path: read.append(path) or read_holder(path))
    nested_runs.refuse_run_inside(store, tmp_path / "a", inside[0].holder)
    assert sorted(listed) == sorted([store, store / "a", store / "a0", store / "a" / "b", store / "a" / "b0"])
    assert sorted(read) == sorted([store / "a" / LOCK_NAME, store / "a" / "b" / "c1" / LOCK_NAME])
    monkeypatch.undo()
    (store / "a" / LOCK_NAME).unlink()  # torn locks are claim_run_directory's to judge: not the point here
    (store / "a" / "b" / "c1" / LOCK_NAME).unlink()
    owner = claim_run_directory(tmp_path / "a", 0, 1, resume=True, move_aside=False, checkpoints=store)
    for lock in (owner, *inside):
        lock.release()


@pytest.mark.parametrize("first", ["outer", "inner"])
@pytest.mark.parametrize("inner", ["b", "x/y/b", "checkpoints/b", "dirpath of b in x/ckpts"])
def test_a_run_inside_another_live_runs_log_dir_is_refused_whichever_starts_first(tmp_path, first, inner):
    """Run b's log dir (or dirpath) inside run a's log dir, up to NESTED_RUN_DEPTH levels down: with a
    live, b was refused, but with b live a was admitted (a log dir was never searched below), and a's
    move-aside of an earlier run would have taken b's live files. Refused in one line naming both."""
    outer = tmp_path / "a"
    if inner.startswith("dirpath"):
        held = outer / "x" / "ckpts"
        claim_inner = lambda: claim_run_directory(  # noqa: E731
            tmp_path / "b", 0, 1, resume=True, move_aside=False, checkpoints=held
        )
    else:
        held = outer / inner
        claim_inner = lambda: claim_run_directory(held, 0, 1, resume=True, move_aside=False)  # noqa: E731
    claim_outer = lambda: claim_run_directory(outer, 0, 1, resume=True, move_aside=False)  # noqa: E731
    live = (claim_outer if first == "outer" else claim_inner)()
    with pytest.raises(RunLockedError) as error:
        (claim_inner if first == "outer" else claim_outer)()
    text = str(error.value)
    if first == "inner":
        assert text.startswith(f"{outer}: another run holds {held} (pid {os.getpid()}")
        assert "inside this run's log dir" in text and not (outer / LOCK_NAME).exists()
    assert "\n" not in text and str(held) in text
    live.release()
    (claim_inner if first == "outer" else claim_outer)().release()  # once the other run has ended


def test_a_run_deeper_than_the_search_inside_a_log_dir_is_not_looked_for(tmp_path):
    """The bound the docs state: a live run's log dir 4 levels below another's, started first, is not
    found (that far down a run is not searched for at every start); started second, it is refused."""
    inner = tmp_path / "a" / "w" / "x" / "y" / "b"
    deep = claim_run_directory(inner, 0, 1, resume=True, move_aside=False)
    claim_run_directory(tmp_path / "a", 0, 1, resume=True, move_aside=False).release()
    deep.release()
    outer = claim_run_directory(tmp_path / "a", 0, 1, resume=True, move_aside=False)
    with pytest.raises(RunLockedError, match=f"another run holds {tmp_path / 'a'} "):
        claim_run_directory(inner, 0, 1, resume=True, move_aside=False)
    outer.release()
