"""`gptrain checkpoint rewind RUN --to step_N`: go back to an earlier checkpoint of a run (no torch).

After a loss spike a Megatron user edits latest_checkpointed_iteration.txt; a gptrain resume takes
the newest complete step_<M>/ whatever `latest` says, so going back means moving the newer ones out
of the step_<M> names. They are renamed to step_<M>.rewound-<time> (kept, never loaded or pruned),
never deleted. `latest` is pointed at step_N first and the newest is moved first, so a kill at any
point leaves the newest complete checkpoint a sound one (the same command then finishes the rewind).
The run lock is held throughout, and the checkpoints directory's (where it resolves: a run whose
checkpoints resolve outside its log dir locks them there): a live run would save over the rewind.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from pathlib import Path

from gptrain.checkpoint.directory import (
    LATEST,
    REWOUND,
    CheckpointLoadError,
    recorded_checkpoints_dir,
    rename_aside,
    run_dir_of,
    step_dir_name,
)
from gptrain.checkpoint.integrity import checksum_progress, complete_steps, has_manifest, refusal, verify
from gptrain.errors import ConfigError, GptrainError, os_error_text
from gptrain.train.run_lock import LOCK_NAME, RunLock, RunLockedError, acquire, read_holder
from gptrain.utils.atomic import atomic_write_text, fsync_directory

STEP = re.compile(r"^(?:step_)?(\d+)$")


def target_step(text: str, root: Path | None = None) -> int:
    """The step `--to` names: 'step_4' or '4', or a step directory's path (what tab completion gives),
    which must be one of `root`'s: another run's step_4 would rewind this run to its own step_4."""
    path = Path(text.strip())
    match = STEP.match(path.name)
    if match is None:
        raise ConfigError(
            f"--to {text}: give a checkpoint as step_<N> or <N> (gptrain checkpoint verify RUN lists them)"
        )
    if root is not None and len(path.parts) > 1 and path.absolute().parent.resolve() != root.resolve():
        raise ConfigError(
            f"--to {text}: not a checkpoint of {root}; a rewind goes back within one run (give step_<N>)"
        )
    return int(match.group(1))


def rewind(root: Path, step: int, say: Callable[[str], None] = print) -> list[Path]:
    """Make step_<step> the newest complete checkpoint under `root` (a run's checkpoints/), holding the
    run's lock; returns where the newer ones went."""
    where = absolute_as_opened(root)
    run_dir = run_dir_of(where)  # relative only as a copy of hparams.yaml records it
    if not run_dir.is_absolute() and not same_directory(recorded_checkpoints_dir(run_dir), where):
        raise ConfigError(  # a copy written before it recorded the run directory absolute
            f"{root / 'hparams.yaml'} names the run directory {run_dir} relative to where the run was "
            "started, which is not here: run the rewind from that directory, or give the run directory"
        )
    lock = take(run_dir)
    try:  # where it resolves: a run whose checkpoints resolve outside its log dir locks them there
        lock.dirpath_lock = held = take(Path(os.path.realpath(where)))  # (a dirpath, a symlinked one)
    except BaseException:
        lock.release()
        raise
    for note in lock.notes + held.notes:  # a dead run's lock taken over
        say(note)
    try:
        newer = checkpoints_after(root, step)
        check_target(root, step, say)
        atomic_write_text(root / LATEST, step_dir_name(step) + "\n")  # first: never names a moved one
        return [move_aside(root, later, step, say) for later in newer]  # the newest first
    finally:
        lock.release()


def absolute_as_opened(path: Path) -> Path:
    """`path` absolute, naming the directory that opening it opens, with the names the user sees: from
    the shell's working directory ($PWD, where it is this one: a checkpoints/ symlinked elsewhere keeps
    its run directory for parent), each `..` dropping the name before it, or, after a symlink, going
    to its target's parent, as opening it does. `..` from checkpoints/step_2 is checkpoints/, not
    step_2, whose parent would be taken for the run directory."""
    logical = os.environ.get("PWD", "")
    here = Path(logical if os.path.isabs(logical) and _same(logical, ".") else os.getcwd())
    for part in path.parts:
        if part != "..":
            here = here / part
        else:
            here = Path(os.path.realpath(here)).parent if here.is_symlink() else here.parent
    return here


def _same(one: str, other: str) -> bool:
    try:
        return os.path.samefile(one, other)
    except OSError:
        return False


def same_directory(one: Path | None, other: Path) -> bool:
    return one is not None and os.path.realpath(one) == os.path.realpath(other)


def take(directory: Path) -> RunLock:
    """`directory`'s run lock, or one line naming the live run that holds it."""
    try:
        return acquire(directory)
    except RunLockedError:
        holder = read_holder(directory / LOCK_NAME)
        who = holder.describe() if holder else "a run whose lock cannot be read"
        raise RunLockedError(
            f"{directory} is in use by a live run ({who}): a rewind under it would be saved over; stop it "
            f"(gptrain cancel, scancel), then rewind; if that run is gone, delete {directory / LOCK_NAME}"
        ) from None


def move_aside(root: Path, later: int, step: int, say: Callable[[str], None]) -> Path:
    """Rename step_<later> to step_<later>.rewound-<time>. Cut short here, the newest complete
    checkpoint left is still a sound one, and the same command finishes the rewind."""
    path = root / step_dir_name(later)
    try:
        aside = rename_aside(path, REWOUND)
        fsync_directory(root)
    except OSError as error:
        raise GptrainError(
            f"could not move {path} aside ({os_error_text(error, path)}): the rewind to "
            f"{step_dir_name(step)} is not finished; fix that, then run the same command again"
        ) from None
    say(f"moved {path.name} aside to {aside.name}")
    return aside


def checkpoints_after(root: Path, step: int) -> list[int]:
    """The complete steps after `step`, newest first; a one-line error when step_<step> is not a
    complete checkpoint of `root`."""
    steps = complete_steps(root)
    if step not in steps:
        listed = ", ".join(step_dir_name(s) for s in steps) or "none"
        raise ConfigError(
            f"{root / step_dir_name(step)} is not a complete checkpoint of this run (complete: {listed}); "
            "give one of those to --to"
        )
    return sorted((s for s in steps if s > step), reverse=True)


def check_target(root: Path, step: int, say: Callable[[str], None]) -> None:
    """step_<step> against its manifest, sizes and CRC-32s (as a resume checks it); a one-line error,
    nothing moved, when it does not verify."""
    path = root / step_dir_name(step)
    refused = refusal(path)
    if refused is not None:
        raise CheckpointLoadError(f"{path} is not rewound to: {refused}; nothing was rewound")
    problem = verify(path, checksums=True, progress=checksum_progress(path, f"{path.name}: reading"))
    if problem is not None:
        raise CheckpointLoadError(
            f"{path} is damaged ({problem}): nothing was rewound; give an older checkpoint to --to "
            "(gptrain checkpoint verify RUN checks them all)"
        )
    checked = "verified" if has_manifest(path) else "not checked (saved before checkpoints had a manifest)"
    say(f"{path.name}: {checked}")
