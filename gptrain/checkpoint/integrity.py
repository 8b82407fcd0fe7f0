"""What a complete checkpoint must contain, and whether the files on disk still match it.

The COMPLETE marker carries a manifest: every file of the step directory with its size, taken
by rank 0 from the directory listing once every rank's files are written (no data is read
again). `verify` compares the directory with it, so a truncated or missing shard is named
before a load is tried. Sizes catch truncation and lost files, the usual damage of a full disk
or an interrupted copy; they do not catch a flipped bit (DCP stores no checksums, and a second
read of every shard to compute them would double the cost of a save).
"""

from __future__ import annotations

import json
from pathlib import Path

COMPLETE = "COMPLETE"


def manifest(step_dir: Path) -> dict[str, int]:
    """{file name: size in bytes} of the step directory, COMPLETE itself excluded."""
    return {
        entry.name: entry.stat().st_size
        for entry in sorted(step_dir.iterdir())
        if entry.is_file() and entry.name != COMPLETE and not entry.name.endswith(".tmp")
    }


def complete_record(step: int, step_dir: Path) -> str:
    """The text of the COMPLETE marker: the step and the manifest."""
    return json.dumps({"step": step, "files": manifest(step_dir)}, indent=1) + "\n"


def verify(step_dir: Path) -> str | None:
    """None when the checkpoint matches its manifest, else what is wrong (one line)."""
    marker = step_dir / COMPLETE
    if not marker.is_file():
        return f"{step_dir.name} has no {COMPLETE} marker (a save that did not finish)"
    try:
        record = json.loads(marker.read_text())
    except (OSError, ValueError) as error:
        return f"{marker} is unreadable ({error})"
    expected = record.get("files") if isinstance(record, dict) else None
    if expected is None:
        return None  # written before manifests existed: nothing to compare
    for name, size in expected.items():
        path = step_dir / name
        if not path.is_file():
            return f"{path} is missing"
        actual = path.stat().st_size
        if actual != size:
            return f"{path} is {actual} bytes, its manifest says {size} (truncated or replaced)"
    return None
