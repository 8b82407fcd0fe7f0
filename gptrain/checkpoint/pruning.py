"""Rank 0 removing the checkpoints retention drops after a save; whether the disk holds those it keeps."""

from __future__ import annotations

import dataclasses
import os
import shutil
import sys
import threading
from pathlib import Path

from gptrain.checkpoint.directory import step_dir_bytes, step_dir_name
from gptrain.checkpoint.errors import root_cause
from gptrain.checkpoint.integrity import COMPLETE, STEP_DIR, complete_steps, is_complete
from gptrain.checkpoint.retention import STEP, Ranked, Removal, recorded_metric, removals
from gptrain.errors import os_error_text
from gptrain.utils.atomic import fsync_directory


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
        would otherwise wait for in the next collective.

        A step that is a symlink (to another run's step directory) loses the link alone, here: nothing
        through it is touched, its target's COMPLETE above all (that run would then remove it as torn).
        One to another step of this run (`step_6 -> step_2`) keeps its target while the link stays
        (else the kept checkpoint dangles: review X F2); where both go, the link's line says so."""
        links = self._links_within()
        removals, torn = self._removals(saved), self._torn_before(saved)
        going = {step_dir_name(step) for step in [r.step for r in removals] + torn}
        kept = {name for link, chain in links.items() if link not in going for name in chain}
        removals = [r for r in removals if step_dir_name(r.step) not in kept]
        torn = [step for step in torn if step_dir_name(step) not in kept]
        with_target = {link: chain[-1] for link, chain in links.items() if chain[-1] in going - kept}
        removed = []
        for removal in removals:
            path = self.root / step_dir_name(removal.step)
            if not path.is_symlink():
                removed.append(removal)
            elif (target := _unlink_saying_why_not(path)) is not None:
                removed.append(
                    dataclasses.replace(removal, link=target, target_removed=with_target.get(path.name))
                )
        doomed = []
        for step in torn:
            path = self.root / step_dir_name(step)
            if not path.is_symlink():
                doomed.append(path)
            elif (target := _unlink_saying_why_not(path)) is not None:
                print(
                    f"gptrain: {unlinked_text(path, target, 'incomplete', with_target.get(path.name))}",
                    file=sys.stderr,
                )
        doomed += [self.root / step_dir_name(removal.step) for removal in removed if removal.link is None]
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

    def _links_within(self) -> dict[str, tuple[str, ...]]:
        """{name of a step symlink: names of this run's steps its chain passes, one link at a time, to
        the step directory it resolves to (last)}, for the links under `root` that resolve to one of its
        own steps (a link into another run: none). A link kept keeps all of them: a link of the run
        unlinked on the way would leave it dangling."""
        links = {}
        root = self.root.resolve()
        for entry in self.root.iterdir():
            if not (STEP_DIR.match(entry.name) and entry.is_symlink()):
                continue
            try:
                target = entry.resolve()
            except (OSError, RuntimeError):  # a loop of links: nothing of the run's behind it
                continue
            if target.parent != root or not STEP_DIR.match(target.name) or target.name == entry.name:
                continue
            chain, hop = [], entry
            for _ in range(40):  # Linux's MAXSYMLINKS; resolve() above ruled out a loop
                if not hop.is_symlink():
                    break
                hop = hop.parent / os.readlink(hop)
                if hop.parent.resolve() == root and STEP_DIR.match(hop.name) and hop.name != entry.name:
                    chain.append(hop.name)
            links[entry.name] = (*chain, target.name)
        return links

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

    def _clear_step_dir(self, path: Path) -> str | None:
        """Rank 0 removes a torn or superseded save of the same step (no longer a checkpoint before any
        file goes); where that step is a symlink, the link stays until the save written beside it
        (`replacing_dir`) replaces it, and only a dead save's leftover there goes. What stops the save
        when `path` cannot take it (one line, told to every rank)."""
        if path.is_symlink() and path.is_dir():
            try:
                shutil.rmtree(replacing_dir(path), ignore_errors=True)
                replacing_dir(path).mkdir(parents=True)
            except OSError as error:
                return (
                    f"checkpoint {path} cannot be saved beside the symlink of that name: "
                    f"{os_error_text(error, replacing_dir(path))}; fix permissions under {self.root}, then run again"
                )
            return None
        # a dangling link stays: its target may sit on a filesystem not mounted on this node
        if path.is_symlink() and not path.exists():
            return (
                f"checkpoint {path} cannot be saved: it is a symlink to {os.readlink(path)}, which does not "
                f"exist (is its filesystem mounted on this node?); remove the link or restore its target, "
                f"then run the same command again"
            )
        if not path.is_dir() and path.exists():
            return (
                f"checkpoint {path} cannot be saved: a file of that name is in the way; move it out of "
                f"{self.root}, then run the same command again (it resumes from the newest complete checkpoint)"
            )
        if not path.exists():
            return None
        try:
            (path / COMPLETE).unlink(missing_ok=True)
            shutil.rmtree(path)
        except OSError as error:
            return (
                f"checkpoint {path} cannot be saved: an earlier save of that step could not be removed "
                f"({root_cause(error)}); fix permissions under {self.root} or remove it, then run again"
            )
        return None

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
            steps = (self.root / step_dir_name(step) for step in complete_steps(self.root))
            free += sum(
                step_dir_bytes(path) for path in steps if not path.is_symlink()
            )  # unlinking frees none
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


def unlinked_text(path: Path, target: str, why: str, target_removed: str | None = None) -> str:
    """The line of a removed step symlink; `target_removed`: the name of the run's own step directory it
    pointed at, where that is removed as well."""
    if target_removed is not None:
        return f"unlinked {path.name} ({why}; a symlink to {target}, this run's {target_removed}, which is removed as well)"
    return f"unlinked {path.name} ({why}; a symlink to {target}: its target was left alone)"


def replacing_dir(path: Path) -> Path:
    """Where a save of the step whose directory `path` is a symlink is written: a name no lookup takes
    for a step. Once every file is on disk its COMPLETE is written here, then it replaces the link
    (`put_in_place`); a kill on the way is undone at the next resume (replace_recovery)."""
    return path.parent / f".{path.name}.replacing"


def replaced_link(path: Path) -> Path:
    """Where `put_in_place` moves the step symlink `path` while the save takes its name."""
    return path.parent / f".{path.name}.replaced-link"


class LinkNotPutBack(OSError):
    """The save could not be renamed over a step symlink, nor the link put back: the complete save
    and the link are both kept under their dot-names, for the next resume to put the save in place."""


def put_in_place(written: Path, path: Path) -> None:
    """Replace the step symlink `path` with the save written (and marked) in `written`; the link's target
    untouched. The link is moved aside, the save renamed to `path`, then the old link removed: a failure
    before the save's rename puts the link back (where that fails too, LinkNotPutBack), a crash between
    the renames leaves it under the `.replaced-link` name, and one after leaves the save complete: the
    next resume puts each of these right (replace_recovery)."""
    if not path.is_symlink():  # removed meanwhile
        os.rename(written, path)
        fsync_directory(path.parent)
        return
    aside = replaced_link(path)
    os.rename(path, aside)  # atomic for the link itself
    try:
        os.rename(written, path)
    except OSError as error:
        try:
            os.rename(aside, path)
        except OSError as put_back:
            raise LinkNotPutBack(
                f"renaming the save: {error.strerror or error}; putting the link back: {put_back.strerror or put_back}"
            ) from None
        raise
    fsync_directory(path.parent)
    _unlink_saying_why_not(aside)


def _unlink(path: Path) -> str:
    """Remove the symlink `path` itself; returns what it pointed at."""
    target = os.readlink(path)
    os.unlink(path)
    return target


def _unlink_saying_why_not(path: Path) -> str | None:
    """`_unlink`, or None where the link could not be removed, said in one line."""
    try:
        return _unlink(path)
    except OSError as error:
        print(
            f"gptrain: could not remove the symlink {path} ({_reason(error, path)}); remove it",
            file=sys.stderr,
        )
        return None


def _remove_all(paths: list[Path]) -> None:
    """In the background: a step directory that cannot be removed (its COMPLETE went already: no longer
    a checkpoint) is said in one line, never passed over as removed."""
    for path in paths:
        try:
            shutil.rmtree(path)
        except OSError as error:
            if path.exists() or path.is_symlink():  # else gone whole, by another hand
                print(
                    f"gptrain: could not remove {path} ({_reason(error, path)}): no longer a checkpoint "
                    f"(its {COMPLETE} marker went); remove it by hand",
                    file=sys.stderr,
                )


def _reason(error: OSError, path: Path) -> str:
    """Why `path` could not be removed: the file it names where that is one under it."""
    return (
        os_error_text(error, path)
        if error.filename not in (None, str(path))
        else str(error.strerror or error)
    )
