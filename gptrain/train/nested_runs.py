"""Runs inside runs: a log dir inside a directory another live run holds (its log dir, or its
checkpoint dirpath), or a log dir or dirpath holding another live run's log dir or dirpath (up to
NESTED_RUN_DEPTH levels down), is refused: the outer run's move-aside or rewind would take the inner
run's files with it.
"""

from __future__ import annotations

import os
from pathlib import Path

from gptrain.train.lock_holder import Holder
from gptrain.train.run_lock import LOCK_NAME, RunLockedError, live_holder


def refuse_another_runs_directory(checkpoints: Path, log_dir: Path, me: Holder | None, outside: bool) -> None:
    """Refuse checkpoints in a directory another live run holds: its log dir or above (a dirpath set
    to another run's log_dir/checkpoints, which that run never locks), or, for checkpoints inside
    this run's log dir, a lock another run's dirpath left there. Up to this run's own log dir; a
    dirpath's own lock is `acquire`'s to judge, and a stale one is no one's."""
    real, own = Path(os.path.realpath(checkpoints)), Path(os.path.realpath(log_dir))
    for directory in [real, *real.parents][1 if outside else 0 :]:
        if directory == own:
            return
        if (other := live_holder(directory, me)) is not None:
            raise RunLockedError(
                f"{checkpoints}: another run holds {directory} ({other.describe()}), so two runs would save "
                "there: wait for it to end, or give this run its own exp_manager.checkpoint_callback_params."
                f"dirpath; if that run is gone, delete {directory / LOCK_NAME}"
            )


def refuse_enclosing_run(log_dir: Path, me: Holder | None) -> None:
    """Refuse a log dir inside a directory another live run holds (its log dir or its dirpath): that
    run's move-aside of an earlier run, or its rewind, would take this run's files with it."""
    own = Path(os.path.realpath(log_dir))
    for directory in own.parents:
        if (other := live_holder(directory, me)) is not None:
            raise RunLockedError(
                f"{log_dir}: another run holds {directory} ({other.describe()}), and this run's log dir is "
                "inside it, so two runs would write there: wait for it to end, or give this run an "
                f"exp_manager.explicit_log_dir outside {directory}; if that run is gone, delete "
                f"{directory / LOCK_NAME}"
            )


def refuse_run_below(log_dir: Path, me: Holder | None) -> None:
    """Refuse a log dir holding another live run's log dir or dirpath, up to NESTED_RUN_DEPTH levels
    down (`refuse_enclosing_run` from the other side, for a run started first inside it): this run's
    move-aside of an earlier run would take that run's files with it."""
    for lock in locks_below(Path(os.path.realpath(log_dir)), skip=set()):
        if (other := live_holder(lock.parent, me)) is not None:
            raise RunLockedError(
                f"{log_dir}: another run holds {lock.parent} ({other.describe()}), inside this run's log "
                "dir, so two runs would write there: wait for it to end, or give this run an "
                f"exp_manager.explicit_log_dir that holds no other run's; if that run is gone, delete {lock}"
            )


NESTED_RUN_DEPTH = 3
"""How deep below a log dir or a dirpath another run's lock is looked for: one set to a broad
directory (a project's, with its data) must not be walked whole at every start."""


def refuse_run_inside(checkpoints: Path, log_dir: Path, me: Holder | None) -> None:
    """Refuse a dirpath that holds another live run's log dir (`refuse_enclosing_run` from the other
    side, for a run started first inside it), up to NESTED_RUN_DEPTH levels down."""
    root, own = Path(os.path.realpath(checkpoints)), Path(os.path.realpath(log_dir))
    for lock in locks_below(root, skip={own}):
        if (other := live_holder(lock.parent, me)) is not None:
            raise RunLockedError(
                f"{checkpoints}: another run holds {lock.parent} ({other.describe()}), a log dir inside this "
                "run's checkpoint directory, so two runs would write there: wait for it to end, or give "
                "this run its own exp_manager.checkpoint_callback_params.dirpath (or that run an "
                f"exp_manager.explicit_log_dir outside it); if that run is gone, delete {lock}"
            )


def locks_below(top: Path, skip: set[Path]) -> list[Path]:
    """The lock files of the directories 1 to NESTED_RUN_DEPTH levels below `top`: those down to one
    level above listed, the deepest level's lock looked for by name (listing a broad tree's bottom
    level costs as much as all the rest). Step directories (no run's log dir is one, and a checkpoint
    root holds thousands of their files), `skip` and symlinks are not entered."""
    found: list[Path] = []
    level = [top]
    for _ in range(NESTED_RUN_DEPTH):
        below: list[Path] = []
        for directory in level:
            children, locked = listing(directory, skip)
            found += [directory / LOCK_NAME] if locked and directory != top else []
            below += children
        level = below
    return found + [child / LOCK_NAME for child in level if (child / LOCK_NAME).exists()]


def listing(directory: Path, skip: set[Path]) -> tuple[list[Path], bool]:
    """The subdirectories of `directory` to search, and whether it holds a lock; nothing where it
    cannot be listed (another user's directory, gone meanwhile)."""
    try:
        with os.scandir(directory) as entries:
            names = [(entry.name, entry.is_dir(follow_symlinks=False)) for entry in entries]
    except OSError:
        return [], False
    children = [directory / name for name, is_dir in names if is_dir and not name.startswith("step_")]
    return [child for child in children if child not in skip], any(name == LOCK_NAME for name, _ in names)


def is_within(path: Path, directory: Path) -> bool:
    """Whether `path` is `directory` or under it, both resolved: a dirpath inside the log dir as given
    but a symlink to another run's dirpath takes a lock of its own."""
    path, directory = Path(os.path.realpath(path)), Path(os.path.realpath(directory))
    return path == directory or directory in path.parents
