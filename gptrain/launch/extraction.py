"""Decompressing a downloaded shard beside it: atomically, a cut-off archive refused and kept."""

from __future__ import annotations

import bz2
import contextlib
import gzip
import lzma
import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO

from gptrain.data.jsonl import zstd_blocks
from gptrain.errors import DataError
from gptrain.utils.atomic import (
    fsync_directory,
    hold,
    remove_stale_temporaries,
    replace_as_plain_file,
    temporary_sibling,
)
from gptrain.utils.progress import ByteProgress
from gptrain.utils.signals import terminate_as_exception

CHUNK = 1 << 20


STALE_TEMPORARY_S = 3600.0  # an older unheld temporary is a dead writer's (as data prepare's)


EXTRACTORS: dict[str, Callable[[IO[bytes]], IO[bytes]]] = {
    ".gz": lambda raw: gzip.GzipFile(fileobj=raw),
    ".xz": lzma.LZMAFile,
    ".bz2": bz2.BZ2File,  # pbzip2's multi-stream files too
}


def strip_compression(name: str) -> str:
    for suffix in (".zst", *EXTRACTORS):
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return name


def decompressed_blocks(path: Path, progress: ByteProgress | None = None) -> Iterator[bytes]:
    """The archive's content block by block; an archive cut short raises EOFError at its end
    (zstandard's stream reader just stopped there, so a cut-off .zst extracted as a short file).
    `progress` is told the archive's bytes read."""
    with open(path, "rb") as raw, contextlib.ExitStack() as stack:
        if path.suffix == ".zst":
            blocks = zstd_blocks(raw, CHUNK)
        else:
            source = stack.enter_context(EXTRACTORS[path.suffix](raw))
            blocks = iter(lambda: source.read(CHUNK), b"")
        for block in blocks:
            yield block
            if progress is not None:
                progress.update(nbytes=raw.tell() - progress.bytes)


def extract(path: Path, keep: bool = False) -> Path:
    """Decompress .zst/.xz/.gz/.bz2 next to the archive (atomically); other files are returned as is.
    The archive is removed (unless `keep`) only once it has decompressed whole."""
    target = path.with_name(strip_compression(path.name))
    if target == path:
        return path
    if not target.exists():
        remove_stale_extractions(target)
        tmp = temporary_sibling(target)
        try:
            progress = ByteProgress(f"extract {path.name}", path.stat().st_size, what="MiB of the archive")
            with terminate_as_exception(), open(tmp, "wb") as out:  # a time limit's SIGTERM: cleaned up
                hold(out)
                for block in decompressed_blocks(path, progress):
                    out.write(block)
                out.flush()
                os.fsync(out.fileno())  # the data on disk before its name: a crash kept the name, empty
            replace_as_plain_file(tmp, target)  # a plain write's mode, not mkstemp's 0600
            fsync_directory(target.parent)  # the name on disk before the archive's removal
            progress.finished()
        except EOFError:
            raise DataError(
                f"{path}: the archive ends too soon (cut short: an interrupted download or copy);"
                " nothing was extracted and the archive is kept: delete it to download it again"
            ) from None
        except Exception as error:
            raise DataError(f"{path}: cannot decompress: {error}; the archive is kept") from None
        finally:
            tmp.unlink(missing_ok=True)
    if not keep:
        path.unlink(missing_ok=True)
    return target


def remove_stale_extractions(target: Path) -> None:
    """An extraction killed by SIGKILL (an OOM kill, KillWait past a time limit) left its temporary
    file, as large as the shard, and every relaunch that was killed another."""
    removed, _ = remove_stale_temporaries(target, STALE_TEMPORARY_S)
    if removed:
        size = sum(bytes_ for _, bytes_ in removed) / 1e9
        print(
            f"gptrain: removed {len(removed)} unfinished extraction(s) of {target} ({size:.1f} GB)",
            file=sys.stderr,
        )
