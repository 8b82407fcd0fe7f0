"""One run per results directory: a lock file, and no silent restart over an earlier run.

Two runs writing into one `exp_manager.explicit_log_dir` interleave their checkpoints and
logs and break each other's saves, so global rank 0 takes `<dir>/gptrain.lock` (created with
O_EXCL; it records host, boot, pid, process start time, and Slurm job, step and restart count)
before anything is written. A lock whose holder is gone (gptrain.train.lock_holder: its pid, its
boot, its Slurm job and step) is taken over; of two runs that find one stale lock, only the one
that creates its takeover marker (O_EXCL) replaces it. Anything else is refused in one line
naming the holder. The lock is removed at the end of the run; a killed run leaves it, and the next run
takes it over by the rules above. Its writer holds it under flock from the moment it is created, so
one left empty or garbled (killed between creating and writing it) that nobody holds is removed.
A log dir inside a directory another live run holds (its log dir, or its checkpoint dirpath), or a
log dir or dirpath holding another live run's log dir or dirpath (up to NESTED_RUN_DEPTH levels down),
is refused as well: the outer run's move-aside or rewind would take the inner run's files with it.

`exp_manager.resume_if_exists=false` into a directory that holds checkpoints would mix two
runs; it is refused with the choices spelled out, or, with
`exp_manager.move_aside_earlier_run=true`, the earlier run's files are moved to a sibling
directory (never deleted).
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

from gptrain.checkpoint.integrity import complete_steps
from gptrain.errors import ConfigError, GptrainError, os_error_text
from gptrain.train.lock_holder import Holder, same_job_hint, stale_reason
from gptrain.train.lock_holder import process_start_time as process_start_time  # where callers found it

LOCK_NAME = "gptrain.lock"


class RunLockedError(GptrainError):
    """Another live run holds the results directory."""


class EarlierRunError(ConfigError):
    """resume_if_exists=false into a directory holding another run's checkpoints."""


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


def earlier_checkpoints(checkpoints: Path) -> list[str]:
    """The complete checkpoints in the run's `checkpoints` directory, oldest first. A torn step_<N>/ (no
    COMPLETE: a save that died, such as this job's before its requeue) holds nothing to resume, and
    retention removes it."""
    return [f"step_{step}" for step in complete_steps(checkpoints)]


def requeued_own_checkpoint(checkpoints: Path, env: dict[str, str] | os._Environ = os.environ) -> str | None:
    """The newest checkpoint's name when this process is the Slurm job that wrote it, requeued
    (same SLURM_JOB_ID, SLURM_RESTART_COUNT >= 1): the same run, which resumes whatever
    resume_if_exists says, as the requeue exists for. None otherwise."""
    job, restarts = env.get("SLURM_JOB_ID"), env.get("SLURM_RESTART_COUNT", "0")
    if not job or not restarts.isdigit() or int(restarts) < 1:
        return None
    root = checkpoints
    steps = complete_steps(root)  # the COMPLETE markers, as resume reads them: `latest` may lag one
    if not steps:
        return None
    newest = f"step_{steps[-1]}"
    try:
        record = json.loads((root / newest / "COMPLETE").read_text())
    except (OSError, ValueError):
        return None
    return newest if isinstance(record, dict) and record.get("slurm_job_id") == job else None


def earlier_run_error(checkpoints: Path, found: list[str]) -> EarlierRunError:
    """What a fresh start over `found` checkpoints is told (by the job, and by the launch before it)."""
    return EarlierRunError(
        f"exp_manager.resume_if_exists=false but {checkpoints} holds an earlier run's"
        f" checkpoints ({', '.join(found[-3:])}): resume it with exp_manager.resume_if_exists=true,"
        " start a new run under another run.name (or exp_manager.explicit_log_dir), or move the"
        " earlier run aside with exp_manager.move_aside_earlier_run=true (nothing is deleted)"
    )


def earlier_run_checkpoints(log_dir: Path, checkpoints: Path) -> tuple[Path, list[str]]:
    """Where an earlier run left complete checkpoints, and their names: the run's `checkpoints`
    directory, else log_dir/checkpoints (a run before dirpath was set: a fresh start beside it leaves
    two runs' checkpoints under one run directory)."""
    for root in dict.fromkeys((checkpoints, log_dir / "checkpoints")):
        if found := earlier_checkpoints(root):
            return root, found
    return checkpoints, []


def check_fresh_start(log_dir: Path, move_aside: bool, checkpoints: Path | None = None) -> str | None:
    """resume_if_exists=false: refuse a directory with checkpoints, or move its run aside (and its
    `checkpoints` directory, where checkpoint_callback_params.dirpath puts it outside `log_dir`).

    Returns a line for the log when files were moved.
    """
    checkpoints = checkpoints or log_dir / "checkpoints"
    holder, found = earlier_run_checkpoints(log_dir, checkpoints)
    if not found:
        return None
    if not move_aside:
        raise earlier_run_error(holder, found)
    aside = aside_directory(log_dir)
    moved = [p for p in log_dir.iterdir() if p.name != LOCK_NAME]
    for path in moved:
        os.rename(path, aside / path.name)
    line = f"exp_manager.move_aside_earlier_run: moved the earlier run's {len(moved)} entries to {aside}"
    if checkpoints.exists():  # outside log_dir, else moved with it; its lock (this run's) stays
        elsewhere = aside_directory(checkpoints) / checkpoints.name
        elsewhere.mkdir()
        for path in checkpoints.iterdir():
            if path.name != LOCK_NAME:
                os.rename(path, elsewhere / path.name)
        line += f", and its checkpoints to {elsewhere}"
    return line


def aside_directory(log_dir: Path) -> Path:
    """A new sibling `<name>.earlier-<time>[-N]` of the results directory."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    for n in range(1000):
        aside = log_dir.with_name(f"{log_dir.name}.earlier-{stamp}" + (f"-{n}" if n else ""))
        try:
            aside.mkdir()
            return aside
        except FileExistsError:
            continue
    raise ConfigError(f"cannot find a free name beside {log_dir} to move the earlier run to")


def claim_run_directory(
    log_dir: Path,
    rank: int,
    world_size: int,
    resume: bool,
    move_aside: bool,
    saves: bool = True,
    checkpoints: Path | None = None,
) -> RunLock:
    """Rank 0 takes the lock, checks a fresh start and (when the run `saves`) that its checkpoint
    directory (`checkpoints`, else log_dir/checkpoints) takes files; every rank raises the same error
    if refused."""
    checkpoints = checkpoints or log_dir / "checkpoints"
    lock, error = RunLock(), None
    if rank == 0:
        try:
            lock = acquire(log_dir)
            refuse_enclosing_run(log_dir, lock.holder)
            outside = not is_within(checkpoints, log_dir)
            refuse_another_runs_directory(checkpoints, log_dir, lock.holder, outside)
            refuse_run_below(log_dir, lock.holder)  # after: a dirpath that is checkpoints/ is told so
            if outside:  # two runs' saves in one dirpath: refused as one log dir
                lock.made += [] if checkpoints.exists() else [checkpoints]
                lock.dirpath_lock = acquire(Path(os.path.realpath(checkpoints)))  # named as it is
                refuse_run_inside(checkpoints, log_dir, lock.holder)
            if not resume:
                note = check_fresh_start(log_dir, move_aside, checkpoints)
                lock.notes += [note] if note else []
            if saves:
                lock.made += check_writable(checkpoints)
        except GptrainError as failure:
            lock.release()
            error = failure
        except OSError as failure:  # a path under a file, no permission: one line, told to every rank
            lock.release()
            error = ConfigError(
                f"exp_manager.explicit_log_dir {log_dir}: cannot claim it ({os_error_text(failure, log_dir)}); "
                "give a directory this job can create and write"
            )
    if world_size > 1:
        error, lock.notes = shared_outcome(error, lock.notes)
    if error is not None:
        raise error
    return lock


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


def live_holder(directory: Path, me: Holder | None) -> Holder | None:
    """The holder of `directory`'s lock while it may still be running; None for no lock or a stale one."""
    other = read_holder(directory / LOCK_NAME)
    return other if other is not None and me is not None and stale_reason(other, me) is None else None


def is_within(path: Path, directory: Path) -> bool:
    """Whether `path` is `directory` or under it, both resolved: a dirpath inside the log dir as given
    but a symlink to another run's dirpath takes a lock of its own."""
    path, directory = Path(os.path.realpath(path)), Path(os.path.realpath(directory))
    return path == directory or directory in path.parents


def check_writable(directory: Path) -> list[Path]:
    """Make `directory` and a file in it, removed at once: a read-only checkpoint directory was
    found at the first save, hours into the run. (A quota that fills later is not found here.)
    Returns [directory] when this made it, for `RunLock.release` to remove if the run leaves it empty.
    Made where a symlink leads: one into the log dir dangles once a move-aside took its target."""
    real = Path(os.path.realpath(directory))
    made = [] if real.exists() else [real]
    real.mkdir(parents=True, exist_ok=True)
    probe = directory / f".gptrain-write-check.{os.getpid()}"
    try:
        probe.write_bytes(b"")
    except OSError as failure:
        for unused in made:
            with contextlib.suppress(OSError):
                unused.rmdir()
        raise ConfigError(
            f"{directory}: checkpoints cannot be written there ({os_error_text(failure, directory)}); "
            "fix its permissions, or give the run another exp_manager.explicit_log_dir "
            "(or exp_manager.checkpoint_callback_params.dirpath)"
        ) from None
    probe.unlink(missing_ok=True)
    return made


def shared_outcome(error: GptrainError | None, notes: list[str]) -> tuple[GptrainError | None, list[str]]:
    """Rank 0's outcome on every rank, with its notes: every rank logs them, so the logging rank
    (the last, whose lines reach the console) says them too, not rank 0's log file alone. On
    refusal the process group is ended (nothing else will run)."""
    import torch.distributed as dist

    message = [None if error is None else (type(error).__name__, str(error)), notes]
    dist.broadcast_object_list(message, src=0)
    if message[0] is None:
        return None, list(message[1])
    kinds = {"RunLockedError": RunLockedError, "ConfigError": ConfigError, "EarlierRunError": EarlierRunError}
    dist.destroy_process_group()
    name, text = message[0]
    return (error if error is not None else kinds.get(name, GptrainError)(text)), list(message[1])
