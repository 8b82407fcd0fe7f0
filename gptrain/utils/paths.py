"""Whether a directory can be made and written, asked before anything is started or written."""

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
