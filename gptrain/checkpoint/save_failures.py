"""The lines a save ends with when it did not end saved (gptrain.checkpoint.manager): a write that failed,
a checkpoint marked complete whose update after it failed, a save a failed run's way out gave up, or
one rank 0 had not marked by then. Each says what was kept and what to do."""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

from gptrain.checkpoint.errors import CheckpointNotSharedError, CheckpointWriteError, on_rank, root_cause
from gptrain.checkpoint.integrity import COMPLETE, is_complete
from gptrain.checkpoint.pruning import replaced_link, replacing_dir
from gptrain.checkpoint.save_manifest import saving_world_size
from gptrain.errors import os_error_text

NOT_SHARED, WRITE_FAILED, UPDATE_FAILED = "not shared", "write failed", "update failed"
"""Why rank 0 could not mark a synchronous save complete, as every rank learns it (CheckpointManager._finish)."""

# How long a rank other than 0 waits, on a failed run's way out, for rank 0's COMPLETE of a save it wrote.
MARK_WAIT_S = 5.0


def write_failed(root: Path, path: Path, error: BaseException) -> CheckpointWriteError:
    """Remove the partial step directory `path`; earlier checkpoints and `latest` stay as they were.
    The line says whether the directory went, after the write's own error."""
    not_removed = _remove_partial(path)
    if isinstance(error, CheckpointNotSharedError):  # its line says what to do: no disk to free
        return CheckpointNotSharedError(str(error))
    partial = (
        "the partial directory was removed and"
        if not_removed is None
        else f"the partial directory could not be removed ({not_removed}): remove it by hand;"
    )
    return CheckpointWriteError(
        f"checkpoint {path} could not be written ({on_rank(error, saving_world_size())}"
        f"{root_cause(error)}); {partial} earlier checkpoints are unchanged: free space or fix "
        f"permissions under {root}"
    )


def _remove_partial(path: Path) -> str | None:
    """None once `path` is gone (removed here, or by another rank sharing it), else why it is not.
    The first pass goes on past errors (another rank removing the same files); a second, where the
    directory remains, names what stops its removal."""
    shutil.rmtree(path, ignore_errors=True)
    if not path.exists() and not path.is_symlink():
        return None
    try:
        shutil.rmtree(path)
    except FileNotFoundError:  # gone meanwhile, by another rank
        return None
    except OSError as error:
        return os_error_text(error, path)
    return None


def update_failed(root: Path, path: Path, error: BaseException) -> CheckpointWriteError:
    """A checkpoint marked complete stays: resume finds it by its marker, whatever `latest` says; one
    left beside a step symlink set aside (`set_aside`), the next resume puts in place."""
    if not saved(path) and set_aside(path):
        return CheckpointWriteError(
            f"checkpoint {path} was saved as {replacing_dir(path).name}, but neither it nor the symlink it "
            f"replaces (now {replaced_link(path).name}) could be renamed to {path.name} ({root_cause(error)}); "
            f"both are kept and the next resume puts the save in place: fix permissions under {root}"
        )
    return CheckpointWriteError(
        f"checkpoint {path} was saved, but updating {root} after it failed ({root_cause(error)}); "
        f"resume finds it by its {COMPLETE} marker: free space or fix permissions under {root}"
    )


def given_up_text(root: Path, path: Path, error: BaseException) -> str:
    """finish_after_failure's line for a save that timed out or failed (DCP's CheckpointException,
    a dead peer)."""
    if not isinstance(error, TimeoutError) and kept(path):
        # marked complete, then `latest` or pruning failed: resume takes it, as `wait` says
        return str(update_failed(root, path, error))
    reason = "still writing" if isinstance(error, TimeoutError) else root_cause(error)
    return f"checkpoint {path.name} left incomplete ({reason}); resume uses the newest complete one"


def unmarked_text(path: Path) -> str:
    """The line of a save written on this rank that rank 0 had not marked within MARK_WAIT_S."""
    return (
        f"checkpoint {path} was written on this rank but rank 0 had not marked it complete"
        f" after {MARK_WAIT_S:.0f} s; resume takes it only if its {COMPLETE} marker is there"
    )


def saved(path: Path) -> bool:
    """Whether the save of step directory `path` is in place and marked complete. A step symlink still
    there is the checkpoint it links to, another run's: a save over it is written beside it and
    replaces it only once marked (CheckpointManager._mark_complete)."""
    return not path.is_symlink() and is_complete(path)


def set_aside(path: Path) -> bool:
    """Whether a save over the step symlink `path` is complete under its dot-name, the link moved aside
    and neither renamed back (pruning.LinkNotPutBack): the next resume puts the save in place."""
    return not os.path.lexists(path) and is_complete(replacing_dir(path))


def kept(path: Path) -> bool:
    """Whether the save of `path` is kept for a resume (`saved`, or `set_aside`): not removed on a failure."""
    return saved(path) or set_aside(path)


def marked_within(path: Path, timeout_s: float) -> bool:
    """Whether the save of `path` is marked (`saved`), or is within `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while not saved(path):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True
