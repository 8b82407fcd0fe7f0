"""What a user's path names (a file, a directory, nothing, or a path the file system refuses to look
up, and why); whether a directory can be made and written, asked before anything is started or
written; where a run was started, from the relative paths its hparams.yaml records. Standard
library only: login-node commands ask it."""

from __future__ import annotations

import errno
import os
import stat
import tempfile
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
        directory, link = unsearchable_directory(path)
        through = f" (reached through the link {link})" if link is not None else ""
        advice = f"check the permissions of {directory}{through} and the directories above it"
    elif error.errno == errno.ELOOP:
        advice = "check the symbolic links on its way (one may point at itself)"
    else:
        advice = "check the file system"
    return f"cannot be looked up ({error.strerror or error}); {advice}"


MAX_LINK_HOPS = 40
"""Symbolic links followed in one lookup before giving up, as Linux's limit (ELOOP)."""


def unsearchable_directory(path: Path) -> tuple[Path, Path | None]:
    """The directory that refused the lookup of `path`, and the first symbolic link on the way to
    it (None if none). Each name is looked up without following it (a stat through a link refuses
    at the link, naming its searchable parent), and a link's target is walked in its place, so
    `~/data` -> `/lustre/proj/x` names the /lustre directory that refused. `path`'s parent where
    no refusal is found (the permissions changed since)."""
    directory = Path(path.anchor) if path.is_absolute() else Path()
    names, first_link, hops = list(path.parts[1:] if path.is_absolute() else path.parts), None, 0
    while names:
        name = names.pop(0)
        entry = directory / name
        try:
            mode = os.stat(entry, follow_symlinks=False).st_mode  # lstat, through os.stat as Path.stat
        except PermissionError:
            return directory, first_link
        except OSError:
            break
        if stat.S_ISLNK(mode):
            hops += 1
            if hops > MAX_LINK_HOPS:  # a loop: ELOOP, which the caller tells apart
                break
            try:
                target = Path(os.readlink(entry))
            except OSError:
                break
            first_link = entry if first_link is None else first_link
            names = list(target.parts[1:] if target.is_absolute() else target.parts) + names
            directory = Path(target.anchor) if target.is_absolute() else directory
        elif name == "..":
            directory = directory / ".." if directory.name in ("", "..") else directory.parent
        elif name != ".":
            directory = entry
    return path.parent, None


def directory_blocker(path: str | os.PathLike[str], must_write: bool = False) -> str | None:
    """Why `path` cannot be made a directory (the nearest existing ancestor is a file, read-only
    or not writable), or None. With `must_write`, an existing directory must be writable too.
    It leaves nothing behind, so a dry run can ask. Path.exists raised PermissionError under a
    directory this user may not search (a bare line)."""
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
    return create_file_blocker(existing)


def create_file_blocker(directory: Path) -> str | None:
    """Why no file can be created in `directory`, found by creating one (nameless where the file
    system allows, else removed at once), or None. The permission bits say yes to root everywhere:
    a directory under /proc or /sys passed os.access and failed when written."""
    try:
        with tempfile.TemporaryFile(dir=directory, prefix=".gptrain-write-check-"):
            return None
    except OSError as error:
        return f"no file can be created in {directory}: {error.strerror or error}"


def started_in(run_dir: Path, recorded: str) -> Path | None:
    """The directory a run was started in, when its hparams.yaml records its run directory
    `run_dir` (absolute) by the relative path `recorded`; None for an absolute one, or one that
    does not end `run_dir`'s path (the run was moved)."""
    parts = Path(os.path.normpath(recorded)).parts
    if Path(recorded).is_absolute() or ".." in parts or run_dir.parts[-len(parts) :] != parts:
        return None
    return Path(*run_dir.parts[: -len(parts)])
