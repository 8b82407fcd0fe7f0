"""Whether a directory can be made and written, asked before anything is started or written; where
a run was started, from the relative paths its hparams.yaml records."""

from __future__ import annotations

import os
from pathlib import Path


def directory_blocker(path: str | os.PathLike[str], must_write: bool = False) -> str | None:
    """Why `path` cannot be made a directory (the nearest existing ancestor is a file, read-only
    or not writable), or None. With `must_write`, an existing directory must be writable too.
    It creates nothing, so a dry run can ask; root may still fail where it looks writable (/proc)."""
    target = Path(path)
    existing = target
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        return f"{existing} is not a directory"
    if existing == target and not must_write:
        return None
    if os.statvfs(existing).f_flag & os.ST_RDONLY:
        return f"{existing} is on a read-only file system"
    if not os.access(existing, os.W_OK | os.X_OK):
        return f"{existing} is not writable"
    return None


def started_in(run_dir: Path, recorded: str) -> Path | None:
    """The directory a run was started in, when its hparams.yaml records its run directory
    `run_dir` (absolute) by the relative path `recorded`; None for an absolute one, or one that
    does not end `run_dir`'s path (the run was moved)."""
    parts = Path(os.path.normpath(recorded)).parts
    if Path(recorded).is_absolute() or ".." in parts or run_dir.parts[-len(parts) :] != parts:
        return None
    return Path(*run_dir.parts[: -len(parts)])
