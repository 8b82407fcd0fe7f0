"""What a user's path names (a file, a directory, nothing, or a path the file system refuses to look
up, and why); whether a directory can be made and written, asked before anything is started or
written; where a run was started, from the relative paths its hparams.yaml records. Standard
library only: login-node commands ask it."""

from __future__ import annotations

import errno
import os
import stat
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Lookup:
    """What one stat of a user's path found. `kind` is 'file', 'directory', 'other' (a pipe, a
    device: `mode` tells which), 'missing' or 'unreachable' (`why` then says why, and what to do)."""

    kind: str
    mode: int = 0
    why: str = ""


def look_up(path: str | os.PathLike[str]) -> Lookup:
    """Stat `path` once (through Path.stat, as Path.is_file does) and say what it is. Path.is_file
    and exists raise PermissionError (Python 3.11) under a directory this user may not search: a
    bare '<path>: Permission denied' wherever a caller did not catch it, and each that did worded
    it apart."""
    try:
        mode = Path(path).stat().st_mode
    except (FileNotFoundError, NotADirectoryError, ValueError):  # ValueError: a NUL, as is_file
        return Lookup("missing")
    except OSError as error:
        return Lookup("unreachable", why=_unreachable_why(Path(path), error))
    if stat.S_ISREG(mode):
        return Lookup("file", mode)
    return Lookup("directory" if stat.S_ISDIR(mode) else "other", mode)


def _unreachable_why(path: Path, error: OSError) -> str:
    """'cannot be looked up (<strerror>); <what to check>', to follow the path as each caller
    names it (after its key or flag)."""
    if isinstance(error, PermissionError):
        advice = f"check the permissions of {unsearchable_directory(path)} and the directories above it"
    elif error.errno == errno.ELOOP:
        advice = "check the symbolic links on its way (one may point at itself)"
    else:
        advice = "check the file system"
    return f"cannot be looked up ({error.strerror or error}); {advice}"


def unsearchable_directory(path: Path) -> Path:
    """The directory that refused the lookup of `path`: the deepest one above it that can itself be
    looked up (its parent, unless one further up refuses too)."""
    for ancestor in reversed(path.parents[:-1]):  # from the top down; the top one (/ or .) is given
        try:
            ancestor.stat()
        except PermissionError:
            return ancestor.parent
        except OSError:
            break
    return path.parent


def directory_blocker(path: str | os.PathLike[str], must_write: bool = False) -> str | None:
    """Why `path` cannot be made a directory (the nearest existing ancestor is a file, read-only
    or not writable), or None. With `must_write`, an existing directory must be writable too.
    It creates nothing, so a dry run can ask; root may still fail where it looks writable (/proc).
    Path.exists raised PermissionError under a directory this user may not search (a bare line)."""
    target = Path(path)
    existing, found = target, look_up(target)
    while found.kind == "missing" and existing != existing.parent:
        existing = existing.parent
        found = look_up(existing)
    if found.kind == "unreachable":
        return f"{existing} {found.why}"
    if found.kind != "directory":
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
