"""No silent restart over an earlier run.

`exp_manager.resume_if_exists=false` into a directory that holds checkpoints would mix two
runs; it is refused with the choices spelled out, or, with
`exp_manager.move_aside_earlier_run=true`, the earlier run's files are moved to a sibling
directory (never deleted). A Slurm job requeued into its own checkpoints is the same run.
"""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path

from gptrain.checkpoint.integrity import complete_steps
from gptrain.errors import ConfigError
from gptrain.train.run_lock import LOCK_NAME

# Megatron's tracker file: the iteration its --load resumes from (megatron/training/checkpointing.py).
MEGATRON_TRACKER = "latest_checkpointed_iteration.txt"
MEGATRON_ITERATION = re.compile(r"iter_\d+")


class EarlierRunError(ConfigError):
    """resume_if_exists=false into a directory holding another run's checkpoints."""


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


def earlier_run_error(checkpoints: Path, found: list[str], prefix: str = "") -> EarlierRunError:
    """What a fresh start over `found` checkpoints is told (by the job, and by the launch before it,
    whose keys are the job's under `prefix`, `training.`)."""
    em = f"{prefix}exp_manager"
    return EarlierRunError(
        f"{em}.resume_if_exists=false but {checkpoints} holds an earlier run's"
        f" checkpoints ({', '.join(found[-3:])}): resume it with {em}.resume_if_exists=true,"
        f" start a new run under another {prefix}run.name (or {em}.explicit_log_dir), or move the"
        f" earlier run aside with {em}.move_aside_earlier_run=true (nothing is deleted)"
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


def foreign_checkpoint(log_dir: Path, checkpoints: Path) -> tuple[str, Path] | None:
    """A checkpoint NeMo's or Megatron's resume would continue from, where this run looks for its own:
    ("NeMo", path) for what NeMo's exp_manager resumes from in a run's checkpoints/ (a distributed
    checkpoint directory named *last or *end, else a *last.ckpt or *end.ckpt below it), ("Megatron",
    path) for Megatron's tracker file or an iter_<N> directory in the run directory. None if neither."""
    for root in dict.fromkeys((checkpoints, log_dir / "checkpoints")):
        if not root.is_dir():
            continue
        dirs = sorted(p for p in root.iterdir() if p.is_dir() and p.name.endswith(("last", "end")))
        files = dirs or sorted(p for end in ("*last.ckpt", "*end.ckpt") for p in root.rglob(end))
        if files:
            return "NeMo", files[0]
    for root in dict.fromkeys((log_dir, checkpoints)):
        if (root / MEGATRON_TRACKER).is_file():
            return "Megatron", root / MEGATRON_TRACKER
        if root.is_dir() and (
            iters := sorted(p for p in root.iterdir() if MEGATRON_ITERATION.fullmatch(p.name))
        ):
            return "Megatron", iters[-1]
    return None


def refuse_foreign_checkpoints(log_dir: Path, checkpoints: Path, prefix: str = "") -> None:
    """resume_if_exists=true, no resume_from_checkpoint and no complete gptrain checkpoint, over a NeMo or
    Megatron run's checkpoints: NeMo and Megatron would continue them; gptrain, which cannot read them,
    would train from scratch beside them and overwrite the run's hparams.yaml. Refused in one line (by the
    job, and by the launch before it, whose keys are the job's under `prefix`, `training.`)."""
    if (
        earlier_run_checkpoints(log_dir, checkpoints)[1]
        or (found := foreign_checkpoint(log_dir, checkpoints)) is None
    ):
        return
    kind, path = found
    raise ConfigError(
        f"{path}: {kind}'s checkpoint, which gptrain cannot continue, and no gptrain checkpoint in {checkpoints}:"
        f" with {prefix}exp_manager.resume_if_exists=true {kind} would resume it, gptrain would train from"
        f" scratch beside it; start the run in its own directory (another {prefix}run.name or"
        f" {prefix}exp_manager.explicit_log_dir)"
        " (to continue its weights, convert them to a Hugging Face model and 'gptrain import' that)"
    )
