"""On-disk cache of dataset index arrays, keyed by a hash of what determines them.

Many ranks on a shared filesystem may build or read the same cache at once. Every
array is written under a temporary name and renamed into place; the description file
is renamed last, so a reader that finds it also finds complete arrays. Two builders
racing each write identical bytes, and the last rename wins harmlessly.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import re
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from gptrain.data.map_limit import OutOfMemoryMaps
from gptrain.errors import DataError, os_error_text
from gptrain.utils.atomic import atomic_write, atomic_write_text
from gptrain.utils.limits import is_out_of_memory_maps, is_too_many_open_files, too_many_open_files

logger = logging.getLogger(__name__)
ORPHAN_AGE_S = 3600.0  # a builder writes a file in minutes at most, and its mtime moves as it writes
_DIGEST_HEX = re.compile(r"[0-9a-f]{32}")


def describe(fields: Mapping[str, Any]) -> tuple[str, str]:
    """(JSON description, its md5 hex digest): the cache key of a set of indices."""
    text = json.dumps(fields, indent=4, sort_keys=False)
    return text, hashlib.md5(text.encode("utf-8"), usedforsecurity=False).hexdigest()


def file_fingerprint(path_prefix: str, memo_dir: str | os.PathLike[str] | None = None) -> dict[str, Any]:
    """The cache key's part for the data: a digest of the .idx's bytes.

    The indices depend only on the .idx (sequence lengths and count), so a copy at another path
    or with other mtimes (local NVMe on each node, rsync without -t) finds the same cache, and a
    rewritten .idx misses it even at the same size. The .bin stays out: its tokens do not enter
    the indices and its size is fixed by the .idx (IndexedDataset refuses any other on open).
    A source without an .idx file (an in-memory one) is keyed by its path, as before."""
    idx = path_prefix + ".idx"
    if not os.path.isfile(idx):
        return {"dataset_path": os.path.abspath(path_prefix)}
    return {"idx_blake2b": idx_digest(idx, memo_dir)}


def idx_digest(path: str, memo_dir: str | os.PathLike[str] | None = None) -> str:
    """blake2b-128 of the file's bytes, kept in `memo_dir` under the file's identity on disk
    (absolute path, size, mtime, ctime, inode): a restart on the same files reads none of a
    2 GB .idx, a new copy (new mtime and ctime) is hashed once. ctime cannot be set back by a
    user, so a file rewritten in place with its old mtime restored is hashed again."""
    stat = os.stat(path)
    identity = (
        f"{os.path.abspath(path)}\0{stat.st_size}\0{stat.st_mtime_ns}\0{stat.st_ctime_ns}\0{stat.st_ino}"
    )
    name = hashlib.md5(identity.encode("utf-8", "surrogateescape"), usedforsecurity=False).hexdigest()

    def compute() -> str:
        start = time.perf_counter()
        digest = hash_file(path)
        logger.info("hashed %s (%d bytes) for the index cache key in %.1f s", path, stat.st_size,
                    time.perf_counter() - start)  # fmt: skip
        return digest

    memo = Path(memo_dir, f"idx-{name}.blake2b") if memo_dir is not None else None
    return remembered(memo, compute, _DIGEST_HEX)


def hash_file(path: str | os.PathLike[str]) -> str:
    """blake2b-128 hex digest of a file (hashlib reads it a buffer at a time: memory stays flat)."""
    with open(path, "rb") as handle:
        return hashlib.file_digest(handle, lambda: hashlib.blake2b(digest_size=16)).hexdigest()


def remembered(path: Path | None, compute: Callable[[], str], pattern: re.Pattern[str]) -> str:
    """compute(), kept in the file `path` so that later runs read it instead: for a pure function
    too slow to run at every start. A missing or malformed file is recomputed and rewritten; an
    unwritable directory only means computing it again next time (a read-only cache still loads)."""
    if path is not None:
        try:
            text = path.read_text(encoding="utf-8").strip()
            if pattern.fullmatch(text):
                return text
        except (OSError, UnicodeDecodeError):
            pass
    value = compute()
    if path is not None:
        try:
            atomic_write_text(path, value + "\n")
        except OSError as error:
            logger.info("cannot keep %s (it is recomputed next time): %s", path, error.strerror or error)
    return value


class IndexCache:
    """Named .npy arrays plus a description file under `<dir>/<hash>-<kind>-<split>-*`."""

    def __init__(self, directory: str | os.PathLike[str], digest: str, kind: str, split: str) -> None:
        self.directory = Path(directory)
        self.base = f"{digest}-{kind}-{split}"

    def path(self, name: str) -> Path:
        return self.directory / f"{self.base}-{name}"

    def load(
        self, names: tuple[str, ...], check: Callable[[dict[str, np.ndarray]], str | None] | None = None
    ) -> dict[str, np.ndarray] | None:
        """The cached arrays (memory-mapped), or None when the cache is absent or unreadable.

        `check` says what is wrong with arrays that load but do not fit together (or None):
        a half-copied cache directory can hold well-formed .npy files of another build.
        """
        # os.path, not pathlib: False where the directory may not be searched (save() then says so)
        if not os.path.isfile(self.path("description.txt")):
            return None
        arrays: dict[str, np.ndarray] = {}
        try:
            for name in names:
                arrays[name] = np.load(self.path(f"{name}.npy"), mmap_mode="r")
            problem = check(arrays) if check is not None else None
        except (OSError, ValueError, EOFError) as error:  # EOFError: numpy's word for an empty .npy
            path = self.path(f"{names[len(arrays)]}.npy") if len(arrays) < len(names) else self.path("*")
            if isinstance(error, OSError) and is_too_many_open_files(error):
                raise DataError(too_many_open_files(path, error)) from None
            if isinstance(error, OSError) and is_out_of_memory_maps(error):  # a sound cache: never rebuilt
                raise OutOfMemoryMaps.now(path) from None
            problem = str(error)
        if problem is not None:
            logger.warning("ignoring unreadable index cache %s: %s", self.path("*"), problem)
            return None
        return arrays

    def remove_orphans(self, older_than_s: float = ORPHAN_AGE_S) -> None:
        """Delete this cache's temporary files left by a builder killed mid-write (SIGKILL, OOM):
        gigabytes each at 10^8 documents. Only those untouched for `older_than_s`: a live builder
        on another node may be writing one of these names now."""
        cutoff = time.time() - older_than_s
        for path in self.directory.glob(f".{self.base}-*.tmp"):
            with contextlib.suppress(OSError):  # gone already, or another builder's to remove
                if path.stat().st_mtime < cutoff:
                    path.unlink()
                    logger.info("removed %s, left by an index build that did not finish", path)

    def save(self, arrays: Mapping[str, np.ndarray], description: str) -> None:
        """Write every array atomically, then the description (the 'complete' marker)."""
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            self.remove_orphans()
            for name, array in arrays.items():
                with atomic_write(self.path(f"{name}.npy")) as handle:
                    np.save(handle, array, allow_pickle=False)
            atomic_write_text(self.path("description.txt"), description)
        except OSError as error:
            if is_too_many_open_files(error):
                raise DataError(too_many_open_files(self.directory, error)) from None
            raise DataError(
                f"cannot write dataset index cache in {self.directory} ({os_error_text(error, self.directory)}); "
                "give a directory this job can write: model.data.index_mapping_dir (train, eval) or "
                "--cache-dir (data sample)"
            ) from error
