"""Checkpoints in step directories with a `latest` marker that is written last.

Layout under the checkpoint root:
    step_<N>/            torch.distributed.checkpoint files (.metadata, __<rank>_0.distcp)
    step_<N>/rank_<r>.pt this rank's extra state (RNG streams), written atomically
    step_<N>/COMPLETE    written by rank 0 once every rank has written its files
    latest               'step_<N>', rewritten atomically after COMPLETE

A directory without COMPLETE is a save that died half way: lookups ignore it, so a
resumed run never loads a torn checkpoint. Works without a process group (one process).
"""

from __future__ import annotations

import json
import re
import shutil
import warnings
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp

from gptrain.utils.atomic import atomic_write, atomic_write_text

STEP_DIR = re.compile(r"^step_(\d+)$")
COMPLETE = "COMPLETE"
LATEST = "latest"
# One process without a process group is a supported case here, not a mistake (also
# raised from the async-save thread, where a local catch_warnings would not reach).
warnings.filterwarnings("ignore", message=".*torch.distributed is disabled.*")


def step_dir_name(step: int) -> str:
    return f"step_{step}"


def is_complete(path: Path) -> bool:
    return (path / COMPLETE).is_file()


def complete_steps(root: Path) -> list[int]:
    """Steps of the complete checkpoints under `root`, oldest first."""
    if not root.is_dir():
        return []
    steps = []
    for entry in root.iterdir():
        match = STEP_DIR.match(entry.name)
        if match and entry.is_dir() and is_complete(entry):
            steps.append(int(match.group(1)))
    return sorted(steps)


def newest_complete(root: Path) -> Path | None:
    """The newest complete checkpoint; incomplete directories (no COMPLETE) are ignored."""
    steps = complete_steps(Path(root))
    return Path(root) / step_dir_name(steps[-1]) if steps else None


def _distributed() -> bool:
    return dist.is_available() and dist.is_initialized()


def _barrier() -> None:
    if _distributed():
        dist.barrier()


class CheckpointManager:
    """Saves and finds checkpoints of one run; rank 0 writes markers and prunes old ones."""

    def __init__(
        self, root: str | Path, keep_last: int | None, rank: int = 0, async_save: bool = False
    ) -> None:
        self.root = Path(root)
        self.keep_last = keep_last if keep_last and keep_last > 0 else None
        self.rank = rank
        self.async_save = async_save
        self._pending: tuple[int, Future] | None = None

    def save(self, step: int, state: dict[str, Any], rank_state: dict[str, Any]) -> Path:
        """Write `state` (DCP, shared by all ranks) and `rank_state` (torch.save, per rank)."""
        self.wait()
        path = self.root / step_dir_name(step)
        if self.rank == 0 and path.exists():
            shutil.rmtree(path)  # a torn or superseded save of the same step
        _barrier()
        path.mkdir(parents=True, exist_ok=True)
        with atomic_write(path / f"rank_{self.rank}.pt") as handle:
            torch.save(rank_state, handle)
        if self.async_save:
            self._pending = (step, dcp.async_save(state, checkpoint_id=str(path)))
            return path
        dcp.save(state, checkpoint_id=str(path))
        self._finish(step)
        return path

    def wait(self) -> None:
        """Block until a pending async save is written, then mark it complete."""
        if self._pending is None:
            return
        step, future = self._pending
        self._pending = None
        future.result()
        self._finish(step)

    def _finish(self, step: int) -> None:
        _barrier()  # every rank's files are on disk before the marker
        if self.rank == 0:
            path = self.root / step_dir_name(step)
            atomic_write_text(path / COMPLETE, json.dumps({"step": step}) + "\n")
            atomic_write_text(self.root / LATEST, step_dir_name(step) + "\n")
            self._prune()
        _barrier()

    def _prune(self) -> None:
        """Keep the newest `keep_last` complete checkpoints; drop torn ones older than the newest."""
        steps = complete_steps(self.root)
        if not steps:
            return
        doomed = steps[: -self.keep_last] if self.keep_last else []
        for entry in self.root.iterdir():
            match = STEP_DIR.match(entry.name)
            if match and not is_complete(entry) and int(match.group(1)) < steps[-1]:
                doomed.append(int(match.group(1)))
        for step in doomed:
            shutil.rmtree(self.root / step_dir_name(step), ignore_errors=True)

    def newest(self) -> Path | None:
        return newest_complete(self.root)

    def load(
        self, path: Path, state: dict[str, Any], apply: Callable[[dict[str, Any]], None]
    ) -> dict[str, Any]:
        """Load DCP `state` in place, hand it to `apply`, return this rank's extra state."""
        dcp.load(state, checkpoint_id=str(path))
        apply(state)
        rank_file = path / f"rank_{self.rank}.pt"
        if not rank_file.is_file():
            return {}
        return torch.load(rank_file, map_location="cpu", weights_only=False)
