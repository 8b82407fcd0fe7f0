"""What a kill in a save over a step symlink left (pruning.put_in_place: the save written and marked in
`.step_N.replacing`, the link moved aside to `.step_N.replaced-link`, the save renamed to `step_N`, the
link removed), put right by rank 0 before a resume lists the run's steps: no lookup reads the dot-names,
so the step was lost to the resume and the save's disk to retention (review Z)."""

from __future__ import annotations

import os
import re
import shutil
import sys
from pathlib import Path

from gptrain.checkpoint.integrity import is_complete
from gptrain.checkpoint.pruning import replaced_link, replacing_dir
from gptrain.utils.atomic import fsync_directory

LEFT = re.compile(r"^\.(step_\d+)\.(?:replacing|replaced-link)$")


def recover_replaced_links(root: Path) -> list[str]:
    """Rank 0, before the resume lists steps: for each step a save over its symlink left dot-names of,
    the complete save put in place, else the link put back; then what is left beside `step_N` removed
    (the link itself, never through it). Each action in one line, on stderr; returns the lines."""
    try:
        names = os.listdir(root)
    except FileNotFoundError:
        return []
    lines: list[str] = []
    for name in sorted({m[1] for m in map(LEFT.match, names) if m}):
        try:
            lines += _recover(root / name)
        except OSError as error:
            lines.append(f"could not put {root / name} right ({error}): see the .{name}.* entries beside it")
    for line in lines:
        print(f"gptrain: {line}", file=sys.stderr)
    return lines


def _recover(path: Path) -> list[str]:
    aside, written = replaced_link(path), replacing_dir(path)
    lines = []
    if not os.path.lexists(path):
        if is_complete(written):
            os.rename(written, path)
            fsync_directory(path.parent)
            lines.append(
                f"put the complete save {written.name} in place as {path.name} (a kill cut its save off)"
            )
        elif aside.is_symlink():
            os.rename(aside, path)
            fsync_directory(path.parent)
            lines.append(
                f"put the symlink {path.name} (to {os.readlink(path)}) back from {aside.name}: a kill cut off "
                "the save over it before it was complete"
            )
    if os.path.lexists(path) and aside.is_symlink():
        target = os.readlink(aside)
        os.unlink(aside)
        lines.append(
            f"removed the symlink {aside.name} (to {target}: its target was left alone), replaced by {path.name}"
        )
    return lines + _remove_unfinished(written, path)


def _remove_unfinished(written: Path, path: Path) -> list[str]:
    """Remove the save a kill left under `written` that did not become `path` (incomplete, or beside it)."""
    if not os.path.lexists(written):
        return []
    kind = "complete" if is_complete(written) else "incomplete"
    if written.is_symlink():
        os.unlink(written)
    else:
        shutil.rmtree(written)
    return [f"removed {written.name}, an {kind} save of {path.name} a kill cut off"]
