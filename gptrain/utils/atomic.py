"""Write files so that a reader never sees a half-written one.

Everything is written under a temporary name in the same directory and renamed
into place only when complete (rename is atomic on POSIX filesystems, also on
the shared filesystems many ranks read from).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import glob
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO

from gptrain.errors import DataError, GptrainError, printable

PROC_STATUS = Path("/proc/self/status")  # Linux: has a "Umask:" row


def temporary_sibling(path: str | os.PathLike[str]) -> Path:
    """A unique temporary name next to `path` that no reader mistakes for it."""
    path = Path(path)
    fd, name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    return Path(name)


def remove_stale_temporaries(
    path: str | os.PathLike[str], older_than_s: float
) -> tuple[list[tuple[Path, int]], list[tuple[Path, int]]]:
    """Remove the temporary siblings of `path` (`temporary_sibling`'s names) untouched for
    `older_than_s`: a writer killed by SIGKILL left them, as large as what it was writing. Younger
    ones may be a live writer's and are kept. Returns (removed, kept), each as (path, bytes)."""
    path = Path(path)
    cutoff = time.time() - older_than_s
    removed, kept = [], []
    # exactly mkstemp's 8 random characters: `.a.bin.*.tmp` would take output `a.bin.x`'s too
    for temp in path.parent.glob(f".{glob.escape(path.name)}.{'?' * 8}.tmp"):
        with contextlib.suppress(OSError):  # gone already, or not ours to remove
            stat = temp.stat()
            if stat.st_mtime >= cutoff or held_by_a_writer(temp):
                kept.append((temp, stat.st_size))
                continue
            temp.unlink()
            removed.append((temp, stat.st_size))
    return removed, kept


def hold(handle: IO) -> None:
    """Mark a temporary file, open for writing, as a live writer's (an exclusive flock, released when
    the last descriptor of it closes, so also when the process dies): `remove_stale_temporaries`
    leaves it whatever its age (a job suspended for hours, a long stretch with nothing to write).
    Open for writing: NFS makes flock a POSIX lock, and an exclusive one needs that (EBADF)."""
    with contextlib.suppress(OSError):  # a file system without locks: the age bound alone keeps it
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)


NO_LOCKS = frozenset({errno.ENOLCK, errno.EBADF, errno.EOPNOTSUPP, errno.ENOSYS})
"""What flock raises where the file system takes no locks of that kind at all."""


def held_by_a_writer(lock: Path) -> bool:
    """Whether a live writer holds `lock` (a temporary file, see `hold`; a staging directory's
    WRITER_LOCK, see `hold_directory`): a shared flock on a read-only descriptor is refused while it
    does (as NFS's POSIX locks allow too: an exclusive one would need write access). False where no
    file is there, or the file system takes no locks (ENOLCK, EBADF, EOPNOTSUPP): the callers' age
    bound alone tells a dead writer's there. True wherever else it cannot be told (another user's)."""
    try:
        descriptor = os.open(lock, os.O_RDONLY | os.O_NOFOLLOW)
    except FileNotFoundError:
        return False
    except OSError:
        return True
    try:
        fcntl.flock(descriptor, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError as error:  # held: EWOULDBLOCK
        return error.errno not in NO_LOCKS
    finally:
        os.close(descriptor)
    return False


def remove_stale_temporary_directories(
    path: str | os.PathLike[str], older_than_s: float
) -> list[tuple[Path, int]]:
    """Remove the temporary sibling directories of `path` (`atomic_directory`'s names) that no live
    writer holds and untouched for `older_than_s`: an export or import killed by SIGKILL left them, as
    large as the model. The age bound keeps a live writer's where its lock cannot be seen (a
    file system without locks, or whose flock is local to each host). Returns the removed ones as
    (path, bytes)."""
    path = Path(path)
    cutoff = time.time() - older_than_s
    removed = []
    for temp in path.parent.glob(f".{glob.escape(path.name)}.{'?' * 8}.tmp"):
        with contextlib.suppress(OSError):  # gone already, or not ours to remove
            stat = temp.lstat()
            if not temp.is_dir() or temp.is_symlink() or stat.st_mtime >= cutoff:
                continue
            if held_by_a_writer(temp / WRITER_LOCK):
                continue
            size = _tree_bytes(temp)
            shutil.rmtree(temp)
            removed.append((temp, size))
    return removed


STALE_TEMPORARY_S = 3600.0
"""An unheld temporary untouched this long is a dead writer's (as data prepare's and download's)."""


def remove_unfinished_directories(path: str | os.PathLike[str], stream: IO[str]) -> None:
    """Before writing `path` with `atomic_directory`, remove what killed writers of it left (see
    `remove_stale_temporary_directories`), said in one line on `stream`."""
    removed = remove_stale_temporary_directories(path, STALE_TEMPORARY_S)
    if removed:
        size = sum(nbytes for _, nbytes in removed) / 1e9
        names = ", ".join(temp.name for temp, _ in removed)
        print(
            f"gptrain: removed {names} beside {path} ({size:.1f} GB): left unfinished by a killed export or import",
            file=stream,
        )


def _tree_bytes(directory: Path) -> int:
    total = 0
    for folder, _, files in os.walk(directory):
        for name in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(folder, name)).st_size
    return total


@contextlib.contextmanager
def atomic_write(path: str | os.PathLike[str], mode: str = "wb") -> Iterator[IO]:
    """Open a temporary sibling of `path` for writing; rename it onto `path` on success."""
    path = Path(path)
    if path.is_dir():  # checked first: found only at the rename, after the work (an evaluation) was done
        raise IsADirectoryError(errno.EISDIR, "is a directory; give a file name", str(path))
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        tmp = temporary_sibling(path)
    except OSError as error:  # the directory refuses a new file: said of the file asked for
        error.filename = str(path)
        raise
    try:
        with open(tmp, mode) as handle:
            yield handle
            handle.flush()
            os.fsync(handle.fileno())
        replace_as_plain_file(tmp, path)
    except BaseException as error:
        tmp.unlink(missing_ok=True)
        # name the file asked for: ENOSPC from a flush or close carries no name at all
        if isinstance(error, OSError) and error.filename in (str(tmp), None):
            error.filename = str(path)
        raise
    fsync_directory(path.parent)


def sync_tree(root: Path) -> None:
    """fsync every file under `root`, then every directory, deepest first."""
    for directory, _, files in sorted(os.walk(root), key=lambda entry: -entry[0].count(os.sep)):
        for name in files:
            with open(os.path.join(directory, name), "rb") as handle:
                os.fsync(handle.fileno())
        fsync_directory(directory)


def fsync_directory(directory: str | os.PathLike[str]) -> None:
    """Make the names created or renamed in `directory` durable (POSIX needs the directory's own
    fsync for that; a file's fsync covers its data). No-op where a directory cannot be opened."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass  # some file systems refuse fsync on a directory (EINVAL): nothing more can be done
    finally:
        os.close(fd)


def atomic_write_text(path: str | os.PathLike[str], text: str) -> None:
    _check_utf8(path, text)
    with atomic_write(path, "w") as handle:
        handle.write(text)


def _check_utf8(path: str | os.PathLike[str], text: str) -> None:
    """A path that is not UTF-8 (an argument, the working directory) reaches Python with its bytes
    as surrogates, which a UTF-8 file cannot hold: say so in one line before anything is written,
    where the write raised a UnicodeEncodeError traceback (the launch's config, hparams.yaml)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as error:
        line_start, line_end = text.rfind("\n", 0, error.start) + 1, text.find("\n", error.start)
        line_end = len(text) if line_end < 0 else line_end
        shown = printable(text[max(line_start, error.start - 60) : min(line_end, error.end + 20)]).strip()
        raise GptrainError(
            f"{printable(os.fspath(path))}: cannot be written as UTF-8: it would hold '{shown}', which "
            "is not UTF-8 (a path from a non-UTF-8 argument or working directory); use UTF-8 paths"
        ) from None


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes) -> None:
    with atomic_write(path, "wb") as handle:
        handle.write(data)


def current_umask() -> int:
    """The process umask. Linux shows it in /proc/self/status; elsewhere it can only be read by
    setting it, which is process-wide: set to 0o077 (a file another thread creates meanwhile is
    private, never world-writable) and restored at once."""
    with contextlib.suppress(OSError, ValueError):
        for row in PROC_STATUS.read_text().splitlines():
            if row.startswith("Umask:"):
                return int(row.split()[1], 8)
    mask = os.umask(0o077)
    os.umask(mask)
    return mask


def replace_as_plain_file(tmp: str | os.PathLike[str], path: str | os.PathLike[str]) -> None:
    """Rename a private temporary (mkstemp's 0600) onto `path` with the mode a plain write gets."""
    os.chmod(tmp, plain_file_mode())
    os.replace(tmp, path)


def plain_file_mode() -> int:
    """The mode open() gives a new file under the process umask: a file written through a private
    temporary gets it, so 077 keeps a corpus private and 002 lets the group rewrite it."""
    return 0o666 & ~current_umask()


def open_to_umask(directory: Path) -> None:
    """Give `directory` (a mkdtemp, always 0700) the mode a plain mkdir gets, and the private
    files and directories in it (safetensors writes 0600) those a plain open and mkdir get, so an
    output in a shared directory is readable by whom the umask allows."""
    mask = current_umask()
    dir_mode, file_mode = 0o777 & ~mask, 0o666 & ~mask
    for root, dirs, files in os.walk(directory):
        for name in dirs:
            if (Path(root, name).lstat().st_mode & 0o777) == 0o700:
                os.chmod(Path(root, name), dir_mode)
        for name in files:
            if (Path(root, name).lstat().st_mode & 0o777) == 0o600:
                os.chmod(Path(root, name), file_mode)
    os.chmod(directory, dir_mode)


def refuse_working_directory(path: str | os.PathLike[str]) -> None:
    """`atomic_directory` replaces an empty `path` with its staging directory: the working directory
    (`gptrain export RUN --to hf .` in a new empty one) would be removed under the shell, which then
    sees nothing there until it enters it again. Filled entry by entry instead, a kill would leave a
    half-written one: refused, before any work, asking for a name."""
    with contextlib.suppress(OSError):  # absent: nothing is replaced
        if os.path.samefile(path, os.curdir):
            raise DataError(
                f"{printable(os.fspath(path))}: is the working directory, which the output would replace "
                "(the shell would be left in a removed directory); give a new directory's name, such as ./model"
            )


@contextlib.contextmanager
def atomic_directory(path: str | os.PathLike[str]) -> Iterator[Path]:
    """A temporary sibling directory to fill; renamed onto `path` (absent or empty) on success,
    removed on failure, so `path` is either complete or not there. On success its mode and that
    of private (0600/0700) entries in it follow the umask, as if made by mkdir and open; its files
    and names are on disk before the rename, and the rename before this returns (a node that
    crashes after an export leaves no complete-looking directory of empty files)."""
    path = Path(path)
    refuse_working_directory(path)
    made = []  # the parents this call created, outermost first (another process's are not its to remove)
    for parent in reversed(path.parents):
        try:
            parent.mkdir()
            made.append(parent)
        except FileExistsError:
            continue
        except OSError:
            if not parent.is_dir():  # cannot be made here: as mkdir(parents=True) would say
                raise
    try:
        staging = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent))
    except OSError as error:  # the parent refuses a new directory: said of the directory asked for
        error.filename = str(path)
        raise
    lock = hold_directory(staging)  # a later export or import never removes it as a dead one's
    try:
        yield staging
        release_directory(staging, lock)  # before the tree is synced: not part of the output
        lock = None
        open_to_umask(staging)
        sync_tree(staging)
        _move_into_place(staging, path)
        fsync_directory(path.parent)
    except BaseException as error:
        release_directory(staging, lock)  # closed first: NFS keeps an open file's removed name
        shutil.rmtree(staging, ignore_errors=True)
        for parent in reversed(made):  # the directories made for it, innermost first, if still empty
            with contextlib.suppress(OSError):
                parent.rmdir()
        if len(error.args) == 1 and isinstance(error.args[0], str):  # a message naming the staging
            error.args = (error.args[0].replace(str(staging), str(path)),)  # directory names `path`
        raise


def _move_into_place(staging: Path, path: Path) -> None:
    """Rename `staging` onto `path`, absent or empty. What another writer put there meanwhile (two
    exports into one directory at once) is never replaced, and said as such, not as a full disk."""
    try:
        if path.exists():
            path.rmdir()  # empty: a non-empty directory is never replaced
        staging.rename(path)
    except OSError as error:
        if error.errno not in (errno.ENOTEMPTY, errno.EEXIST, errno.ENOTDIR):
            raise
        raise DataError(
            f"{path}: another process wrote it while this one ran (two exports or imports into one "
            "directory at once?); nothing of this one was left there: keep that output, or remove it "
            "(or choose another directory) and run again"
        ) from None


WRITER_LOCK = ".gptrain-writer.lock"
"""The file in a staging directory that its writer holds locked. Not the directory itself: NFS makes
flock a POSIX lock, and an exclusive one needs a descriptor open for writing, which a directory's
never is (EBADF), so no staging directory there was ever held."""


def hold_directory(directory: Path) -> int | None:
    """Create `directory`/WRITER_LOCK and hold an exclusive flock on it, open for reading and writing
    (released when it is closed or the process dies): `remove_stale_temporary_directories` leaves
    `directory` while it is held. The open descriptor, or None where it cannot be locked."""
    lock = directory / WRITER_LOCK
    try:
        descriptor = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    except OSError:
        return None
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        release_directory(directory, descriptor)
        return None
    return descriptor


def release_directory(directory: Path, descriptor: int | None) -> None:
    """Undo `hold_directory`: close its descriptor, then remove its file (closed first, as NFS renames
    an open file it is asked to remove to a .nfs name, which would stay in the directory)."""
    if descriptor is not None:
        os.close(descriptor)
    with contextlib.suppress(OSError):
        (directory / WRITER_LOCK).unlink()
