"""Claiming a results directory at start: rank 0 takes the lock (gptrain.train.run_lock), refuses
runs inside runs (gptrain.train.nested_runs), checks a fresh start over an earlier run
(gptrain.train.earlier_run) and that checkpoints can be written; every rank gets the outcome.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from gptrain.errors import ConfigError, GptrainError, os_error_text
from gptrain.train.earlier_run import EarlierRunError, check_fresh_start, refuse_foreign_checkpoints
from gptrain.train.nested_runs import (
    is_within,
    refuse_another_runs_directory,
    refuse_enclosing_run,
    refuse_run_below,
    refuse_run_inside,
)
from gptrain.train.run_lock import RunLock, RunLockedError, acquire


def claim_run_directory(
    log_dir: Path,
    rank: int,
    world_size: int,
    resume: bool,
    move_aside: bool,
    saves: bool = True,
    checkpoints: Path | None = None,
    start_from: str | None = None,
) -> RunLock:
    """Rank 0 takes the lock, checks a fresh start and (when the run `saves`) that its checkpoint
    directory (`checkpoints`, else log_dir/checkpoints) takes files; every rank raises the same error
    if refused. A resume with no checkpoint to `start_from` over NeMo's or Megatron's checkpoints is
    refused first, before anything is written."""
    checkpoints = checkpoints or log_dir / "checkpoints"
    lock, error = RunLock(), None
    if rank == 0:
        try:
            if resume and not start_from:
                refuse_foreign_checkpoints(log_dir, checkpoints)
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
