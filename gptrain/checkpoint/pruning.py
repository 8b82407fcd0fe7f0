"""Rank 0 removing the checkpoints retention drops after a save; whether the disk holds those it keeps."""

from __future__ import annotations

import shutil
import threading
from pathlib import Path

from gptrain.checkpoint.directory import step_dir_bytes, step_dir_name
from gptrain.checkpoint.integrity import COMPLETE, STEP_DIR, complete_steps, is_complete
from gptrain.checkpoint.retention import STEP, Ranked, Removal, recorded_metric, removals


class CheckpointPruning:
    """The retention half of CheckpointManager, which sets these attributes (no torch here)."""

    root: Path
    keep_last: int | None
    monitor: str | None
    mode: str
    _pruning: threading.Thread | None

    def _prune(self, saved: int) -> list[Removal]:
        """Keep the `keep_last` best (by `monitor`, else the newest) complete checkpoints up to `saved`,
        the one just marked complete and always kept, and drop torn ones older than it; returns the
        complete ones removed, for the save's log line. A step newer than `saved` is one this run did not resume
        from (damaged, and not moved aside): counting it would delete the good ones, so it is left
        alone until the run passes it.

        The doomed lose their COMPLETE marker here (one unlink each: no longer checkpoints, so a
        crash mid-removal leaves a torn directory the next prune takes), and are removed in a
        background thread: at 1024 ranks a step directory is ~3,000 unlinks, which every rank
        would otherwise wait for in the next collective."""
        removed = self._removals(saved)
        doomed = [self.root / step_dir_name(step) for step in self._torn_before(saved)]
        doomed += [self.root / step_dir_name(removal.step) for removal in removed]
        for path in doomed:
            (path / COMPLETE).unlink(missing_ok=True)
        self._wait_for_pruning()
        self._pruning = threading.Thread(
            target=_remove_all, args=(doomed,), name="gptrain-prune", daemon=True
        )
        self._pruning.start()
        return removed

    def _removals(self, saved: int) -> list[Removal]:
        """The complete checkpoints up to `saved` that retention removes, each with its reason."""
        if self.keep_last is None:
            return []
        steps = [step for step in complete_steps(self.root) if step <= saved]
        ranked = [Ranked(step, self._metric(step)) for step in steps]
        return removals(ranked, self.keep_last, self.mode, self.monitor)

    def _metric(self, step: int) -> float | None:
        if self.monitor is None:
            return None
        return recorded_metric(self.root / step_dir_name(step), self.monitor)

    def _torn_before(self, saved: int) -> list[int]:
        """Steps older than `saved` whose save died half way. A file under a step's name is no save of the
        run's: it is left alone (unlinking its COMPLETE failed with ENOTDIR, and with it every save of a
        later step)."""
        doomed = []
        for entry in self.root.iterdir():
            match = STEP_DIR.match(entry.name)
            if match and entry.is_dir() and not is_complete(entry) and int(match.group(1)) < saved:
                doomed.append(int(match.group(1)))
        return doomed

    def _wait_for_pruning(self) -> None:
        if self._pruning is not None:
            self._pruning.join()
            self._pruning = None

    def space_warning(self, checkpoint_bytes: int) -> str | None:
        """A warning when the filesystem cannot hold keep_last + 1 checkpoints of this size (2 where
        keep_last is 0: the next save is written before the oldest is removed). The run's existing checkpoints
        count as free space only where retention removes them: keeping every one (save_top_k=-1),
        a resumed run has only the disk's free space for its next two. Ranked by a metric, the newest
        may be none of the best: keep_last + 2 (by step, mode max: + 1)."""
        count = self._on_disk_at_prune()
        existing = self.root
        while not existing.exists() and existing != existing.parent:
            existing = existing.parent
        free = disk_free = shutil.disk_usage(existing).free
        if disk_free < checkpoint_bytes:  # old checkpoints go only once the next one is complete
            return (
                f"{existing} has {disk_free / 1e9:.1f} GB free, but the next checkpoint needs about "
                f"{checkpoint_bytes / 1e9:.1f} GB before retention removes an older one: the save will "
                "fail when the disk fills; free space"
            )
        if self.keep_last is not None:
            free += sum(step_dir_bytes(self.root / step_dir_name(step)) for step in complete_steps(self.root))
        if free >= count * checkpoint_bytes:
            return None
        if self.keep_last is None:
            kept = "the next two; save_top_k=-1 removes none"
        elif self.keep_last == 0:
            kept = "the newest and the next; save_top_k=0 keeps only the newest"
        else:
            kept = f"save_top_k + {count - self.keep_last}"
        remedy = "free space" if self.keep_last == 0 else "free space or lower save_top_k"
        return (
            f"{existing} has {free / 1e9:.1f} GB free for checkpoints, but {count} checkpoints of about "
            f"{checkpoint_bytes / 1e9:.1f} GB ({kept}) need {count * checkpoint_bytes / 1e9:.1f} GB: "
            f"a save will fail when the disk fills; {remedy}"
        )

    def _on_disk_at_prune(self) -> int:
        """Checkpoints on disk just before a save is pruned: the kept ones and the one being written,
        and where a metric ranks them the newest before it, which may be none of the best (by `step`
        with mode max the newest always is: keep_last + 1). Keeping every one (the next two must fit in
        the free space) or only the newest (save_top_k=0): two."""
        if not self.keep_last:
            return 2
        newest_among_best = self.monitor is None or (self.monitor == STEP and self.mode == "max")
        return self.keep_last + (1 if newest_among_best else 2)


def _remove_all(paths: list[Path]) -> None:
    for path in paths:
        shutil.rmtree(path, ignore_errors=True)
