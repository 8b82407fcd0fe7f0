"""What one save cost the training, as the save's log line says it."""

from __future__ import annotations

from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from gptrain.checkpoint.directory import size_text, step_dir_bytes, step_dir_name
from gptrain.checkpoint.pruning import unlinked_text
from gptrain.checkpoint.retention import Removal

if TYPE_CHECKING:
    from gptrain.checkpoint.checksum_writer import OwnWork


@dataclass
class SaveReport:
    """What one save cost the training: the stall, and the write that ran beside it."""

    step: int
    path: Path
    stall_s: float
    """Time the training loop was blocked by this save (all of it for a synchronous save)."""
    write_s: float
    """From the start of the save until its files were on disk (and, on rank 0, it was marked complete)."""
    background: bool
    waited_for_previous_s: float = 0.0
    """Part of the stall spent waiting for the previous save, still writing when this one began."""
    known_bytes: int | None = None
    """Set by rank 0 from the manifest it wrote; elsewhere `bytes` finds it on first use."""
    removed: list[Removal] = field(default_factory=list)
    """Set by rank 0: the checkpoints retention removed after this save, each with its reason."""
    metrics: dict[str, float] | None = None
    """What COMPLETE records for retention to rank by (the validation loss of this step), or None."""
    written_in: Path | None = None
    """Where a save over a step symlink is written (pruning.replacing_dir), until it replaces the link."""
    replaced_link: str | None = None
    """The target of the step symlink this save replaces (left alone), or None."""

    @property
    def files_dir(self) -> Path:
        """Where the save's files are: `written_in` until it replaced the link, then `path`."""
        return self.written_in if self.written_in is not None and self.written_in.exists() else self.path

    @property
    def bytes(self) -> int:
        """The checkpoint's size, found only where it is asked for (the logging rank): every rank
        listing the step directory after every save is O(world^2) stats at scale."""
        if self.known_bytes is None:
            self.known_bytes = step_dir_bytes(self.path)
        return self.known_bytes

    def describe(self, size: bool = True) -> str:
        """The log line; `size=False` leaves the size out (ranks that do not log it need not find it)."""
        named = f"{self.path.name} ({size_text(self.bytes)})" if size else self.path.name
        line = f"saved checkpoint {named}: training stalled {1000 * self.stall_s:.0f} ms"
        if self.background:
            line += f", written in the background in {self.write_s:.1f} s"
        if self.waited_for_previous_s > 0:
            line += f" (waited {self.waited_for_previous_s:.1f} s for the previous save to finish writing)"
        for removal in self.removed:
            if removal.link is None:
                line += f"; removed {step_dir_name(removal.step)} ({removal.reason})"
            else:
                path = Path(step_dir_name(removal.step))
                line += f"; {unlinked_text(path, removal.link, removal.reason, removal.target_removed)}"
        if self.replaced_link is not None:
            name = self.path.name
            line += f"; replaced the symlink {name} (to {self.replaced_link}) with this run's own {name}: its"
            line += " target was left alone"
        return line


@dataclass
class Pending:
    """A background save: its report, and the futures the training thread waits on."""

    report: SaveReport
    written: Future
    """Done when every file is on disk and, on rank 0, the save is marked complete."""
    staging: Future | None
    own_work: OwnWork
    """What the write does on its own, noted while the training thread waits for it."""
