"""One run per results directory: the lock file.

Two runs writing into one `exp_manager.explicit_log_dir` interleave their checkpoints and
logs and break each other's saves, so global rank 0 takes `<dir>/gptrain.lock` (created with
O_EXCL; it records host, boot, pid, process start time, and Slurm job, step and restart count)
before anything is written. A lock whose holder is gone (gptrain.train.lock_holder: its pid, its
boot, its Slurm job and step) is taken over; of two runs that find one stale lock, only the one
that creates its takeover marker (O_EXCL) replaces it. Anything else is refused in one line
naming the holder. The lock is removed at the end of the run; a killed run leaves it, and the next run
takes it over by the rules above. Its writer holds it under flock from the moment it is created, so
one left empty or garbled (killed between creating and writing it) that nobody holds is removed.
What a run checks around its lock: gptrain.train.run_directory.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import os
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import IO, Any

from gptrain.errors import GptrainError
from gptrain.train.lock_holder import Holder, same_job_hint, stale_reason
from gptrain.train.lock_holder import process_start_time as process_start_time  # where callers found it

LOCK_NAME = "gptrain.lock"


class RunLockedError(GptrainError):
    """Another live run holds the results directory."""


def read_holder(path: Path) -> Holder | None:
    try:
        data: dict[str, Any] = json.loads(path.read_text())
        return Holder(**data)
    except (OSError, ValueError, TypeError):
        return None


@dataclass
class RunLock:
    """A held lock (or none, on ranks other than 0); `release` removes it if still ours. `handle`: the
    lock file open under flock for the run's life, how a later run tells a torn lock's holder is gone."""

    path: Path | None = None
    holder: Holder | None = None
    notes: list[str] = field(default_factory=list)  # lines for the run's log
    handle: IO[str] | None = None
    made: list[Path] = field(default_factory=list)
    """Directories this run created beside the lock (checkpoints/): removed at its end while empty."""
    dirpath_lock: RunLock | None = None
    """The lock in a checkpoint_callback_params.dirpath outside the log dir: one run saves there."""

    def log_notes(self, log: Callable[[str], None]) -> None:
        for note in self.notes:
            log(f"gptrain: {note}")

    def release(self) -> None:
        """Give the lock back, and remove the directories the run made and left empty (a run that
        failed before its first save left an empty checkpoints/ behind)."""
        if self.dirpath_lock is not None:  # first: a dirpath this run made is then empty, and removed
            self.dirpath_lock.release()
            self.dirpath_lock = None
        for directory in self.made:
            with contextlib.suppress(OSError):  # not empty (a checkpoint, a user's file): kept
                directory.rmdir()
        self.made = []
        if self.path is not None and read_holder(self.path) == self.holder:
            self.path.unlink(missing_ok=True)
        self.path = None
        if self.handle is not None:
            self.handle.close()
            self.handle = None


def acquire(directory: Path, me: Holder | None = None, attempts: int = 3) -> RunLock:
    """Take `directory`/gptrain.lock, taking over a stale one; RunLockedError if held."""
    me = me or Holder.current()
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / LOCK_NAME
    text = json.dumps(asdict(me)) + "\n"
    try:
        handle = create_exclusively(path, text)
    except FileExistsError:
        return take_over(path, me, text, attempts)
    return RunLock(path, me, handle=handle)


def create_exclusively(path: Path, text: str) -> IO[str]:
    """Create `path` holding `text` (FileExistsError if it exists) and return it open under flock,
    held until closed: a run killed before its text is written (SIGKILL, a full disk) leaves a file
    no process holds, which the next run removes (discard_torn) instead of refusing to start."""
    fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o644)
    out = os.fdopen(fd, "w")
    try:
        hold(out, path)  # refused: a run that found it empty in this instant holds it, and removes it
        if not same_file(path, out):  # removed as torn in the instant before the flock
            raise RunLockedError(f"{path.parent} was taken by another run at the same moment; try again")
    except BaseException:
        out.close()
        raise
    try:
        out.write(text)
        out.flush()
        os.fsync(out.fileno())
    except BaseException:  # ours under the flock: a failed write (a full disk) leaves nothing
        path.unlink(missing_ok=True)
        out.close()
        raise
    return out


def hold(handle: IO[str], path: Path) -> None:
    """flock `handle` for its holder's life; a file system without flock keeps the content rules."""
    try:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as error:
        if error.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
            raise RunLockedError(f"{path}: locked by another run at the same moment; try again") from None


def same_file(path: Path, handle: IO[str]) -> bool:
    try:
        return os.path.samestat(os.stat(path), os.fstat(handle.fileno()))
    except FileNotFoundError:
        return False


def discard_torn(path: Path) -> bool:
    """Remove `path` when it holds no holder (empty or garbled: its writer was killed between
    creating and writing it) and no process holds its flock; False when it may be live, or when the
    file system cannot tell (no flock), where the content rules and their one-line refusal apply."""
    try:  # called a second after it was found unreadable: a live writer fills it within microseconds
        # for writing: over NFS flock is a POSIX lock, and an exclusive one needs a file open for writing
        handle = open(path, "r+")  # noqa: SIM115 (held across the checks below)
    except FileNotFoundError:
        return True  # gone meanwhile: create it again
    except OSError:
        return False  # not ours to write (another user's run): the content rules and their refusal apply
    with handle:
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return False  # held by a live process, or no flock here
        # under its flock the file cannot change hands: only its holder would remove it
        if not same_file(path, handle) or read_holder(path) is not None:
            return False
        path.unlink(missing_ok=True)
    return True


def take_over(path: Path, me: Holder, text: str, attempts: int = 3) -> RunLock:
    other = read_holder(path)
    if other is None:  # just being created by another run, or unreadable: look once more
        time.sleep(1.0)
        other = read_holder(path)
    if other is None and attempts > 1 and discard_torn(path):  # its writer died writing it
        return acquire(path.parent, me, attempts - 1)
    reason = stale_reason(other, me) if other is not None else None
    if other is None or reason is None:
        holder = other.describe() + same_job_hint(other, me) if other else "an unreadable lock file"
        raise RunLockedError(
            f"{path.parent} is in use by another run ({holder}): wait for it to end, or give this run"
            f" another run.name / exp_manager.explicit_log_dir; if that run is gone, delete {path}"
        )
    markers = claim_takeover(path, other, me)
    try:
        current = read_holder(path)
        if current != other:  # another run took it over before this one claimed it
            if attempts > 1 and current is not None and stale_reason(current, me) is not None:
                retry = True  # and died before it got going: take it over from that one
            else:
                raise RunLockedError(f"{path.parent} was taken by another run at the same moment; try again")
        else:
            retry = False
            handle = replace_lock(path, text, me)
    finally:
        for marker in markers:
            marker.unlink(missing_ok=True)
    if retry:
        return take_over(path, me, text, attempts - 1)
    return RunLock(path, me, [f"took over the lock {path} of {other.describe()}: {reason}"], handle)


def replace_lock(path: Path, text: str, me: Holder) -> IO[str]:
    """Rename a written temporary, held under flock, over the stale lock; one that cannot be written
    is removed."""
    temporary = path.with_name(f"{LOCK_NAME}.{me.host}.{me.pid}.tmp")
    handle = open(temporary, "w")  # noqa: SIM115 (held for the run's life)
    try:
        hold(handle, temporary)
        handle.write(text)
        handle.flush()
        os.replace(temporary, path)
    except BaseException:
        handle.close()
        temporary.unlink(missing_ok=True)
        raise
    return handle


def takeover_marker(path: Path, stale: Holder) -> Path:
    """The file whose exclusive creation decides who takes over `stale`'s lock."""
    digest = hashlib.sha1(json.dumps(asdict(stale), sort_keys=True).encode()).hexdigest()[:16]
    return path.with_name(f"{LOCK_NAME}.takeover-{digest}")


def claim_takeover(path: Path, stale: Holder, me: Holder, depth: int = 0) -> list[Path]:
    """Create the takeover marker of `stale` with O_EXCL, so of two runs that both found the lock
    stale only one replaces it. A marker left by a taker that died before it finished is itself
    taken over by the same rules (a chain of markers, removed once the lock is replaced)."""
    marker = takeover_marker(path, stale)
    try:
        create_exclusively(marker, json.dumps(asdict(me)) + "\n").close()
    except FileExistsError:
        taker = read_holder(marker)
        if taker is None:  # being written this instant
            time.sleep(1.0)
            taker = read_holder(marker)
        if taker is None and depth < 8 and discard_torn(marker):  # its taker died writing it
            return claim_takeover(path, stale, me, depth + 1)
        if taker is None or depth >= 8 or stale_reason(taker, me) is None:
            who = taker.describe() if taker else "another run"
            raise RunLockedError(
                f"{path.parent}: {who} is taking over the stale lock {path} at the same moment; "
                f"if no run is starting there, delete {marker}"
            ) from None
        return [*claim_takeover(path, taker, me, depth + 1), marker]
    return [marker]


def live_holder(directory: Path, me: Holder | None) -> Holder | None:
    """The holder of `directory`'s lock while it may still be running; None for no lock or a stale one."""
    other = read_holder(directory / LOCK_NAME)
    return other if other is not None and me is not None and stale_reason(other, me) is None else None
