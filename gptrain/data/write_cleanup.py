"""What a write that does not finish leaves: the directories it made, a killed writer's temporaries."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from gptrain.data.tokenizer_record import SUFFIX
from gptrain.utils.atomic import remove_stale_temporaries


def make_directories(directory: Path, made: list[Path]) -> None:
    """mkdir -p `directory`, putting each directory this call made at the front of `made` (deepest
    first), also where a later level fails: those an aborted writer removes again (a failed run left
    them empty behind). Made is what os.mkdir made, not what looked missing: in `notyet/../prepared`
    an existing `prepared` is not missing before `notyet` is made, and a parallel run that makes a
    directory first owns it."""
    try:
        if _made_here(directory):
            made.insert(0, directory)
        return
    except FileNotFoundError:
        if directory.parent == directory:
            raise
    make_directories(directory.parent, made)
    if _made_here(directory):
        made.insert(0, directory)


def _made_here(directory: Path) -> bool:
    """os.mkdir(directory): True where it made it, False where a directory is there; FileNotFoundError
    where a parent is missing, and the OSError of anything else (no permission, a file of that name)."""
    try:
        os.mkdir(directory)
    except FileNotFoundError:
        raise
    except OSError:
        if os.path.isdir(directory):  # EEXIST, or EACCES from a file system that says so first
            return False
        raise
    return True


def remove_if_empty(directories: list[Path]) -> None:
    """Remove each of these directories (deepest first) that is empty; one that holds something stays."""
    for directory in directories:
        try:
            directory.rmdir()
        except OSError:
            continue


STALE_TEMPORARY_S = 3600.0
"""A writer's temporaries untouched this long are a dead writer's: the .bin's grows as it writes."""


def report_stale_temporaries(bin_path: Path) -> None:
    """Remove what a writer of this output killed by SIGKILL (an OOM kill, KillWait past a Slurm
    time limit) left, as large as its output: no cleanup ran, and nothing else ever removes it.
    Recent ones may be a live writer's (another job on the same output): named, not touched. The
    tokenizer record's staged temporary (gptrain.data.finalize) too: a kill before its rename left it."""
    removed, kept = remove_stale_temporaries(bin_path, STALE_TEMPORARY_S)
    record_removed, record_kept = remove_stale_temporaries(bin_path.with_suffix(SUFFIX), STALE_TEMPORARY_S)
    removed, kept = removed + record_removed, kept + record_kept
    if removed:
        print(
            f"gptrain: removed {_count_files(removed)} beside {bin_path}, left by a write of it that did not finish",
            file=sys.stderr,
        )
    if kept:
        print(
            f"gptrain: WARNING: {_count_files(kept)} beside {bin_path} (.{bin_path.stem}.*.tmp in "
            f"{bin_path.parent}) were written in the last hour by another write of it, running or killed: "
            "delete them if none runs",
            file=sys.stderr,
        )


def _count_files(files: list[tuple[Path, int]]) -> str:
    """'2 temporary files (2.0 kB)'."""
    total = sum(size for _, size in files)
    amount = next(
        (f"{total / unit:.1f} {name}" for unit, name in ((1e9, "GB"), (1e6, "MB")) if total >= unit), None
    )
    return (
        f"{len(files)} temporary file{'s' if len(files) != 1 else ''} ({amount or f'{total / 1e3:.1f} kB'})"
    )
