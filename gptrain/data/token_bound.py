"""Whether a dataset's token ids fit a vocabulary of `vocab_size` ids, checked before training starts
(no torch).

NullTokenizer has no files to say what ids the data holds: an id past --vocab-size would index past
the embedding's rows (Megatron then fails deep in a CUDA kernel, or trains on a padding row). The
.idx's token dtype bounds the ids first (uint16 data never holds 65,536 or more); only where that
bound is not below the vocabulary is the .bin read, in chunks, with progress, and its largest id kept
beside the index caches under the .bin's identity on disk, so that later starts (and the other
ranks, which build after rank 0) read one number instead.
"""

from __future__ import annotations

import hashlib
import os
import re
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np

from gptrain.data.index_cache import remembered
from gptrain.data.indexed import IndexedDataset
from gptrain.errors import DataError
from gptrain.utils.progress import Progress

CHUNK_TOKENS = 1 << 26  # 128 MiB of uint16, 256 MiB of int32: memory stays flat
_INTEGER = re.compile(r"-?[0-9]+")


def dtype_bound(dtype: np.dtype) -> int | None:
    """The largest id a token dtype can hold; None for a float dtype (the .bin is read then)."""
    return int(np.iinfo(dtype).max) if np.issubdtype(dtype, np.integer) else None


def largest_token_id(dataset: IndexedDataset, memo_dir: str | None = None) -> int:
    """The largest id in the dataset's .bin (-1 when it holds none), read once and kept in `memo_dir`."""
    bin_path = str(dataset.bin_path)
    memo = Path(memo_dir, f"bin-{_identity(bin_path)}.largest-id") if memo_dir is not None else None
    return int(remembered(memo, lambda: str(_scan(dataset)), _INTEGER))


def _identity(path: str) -> str:
    """The file as it is on disk (path, size, mtime, ctime, inode): a rewritten .bin is read again."""
    stat = os.stat(path)
    identity = (
        f"{os.path.abspath(path)}\0{stat.st_size}\0{stat.st_mtime_ns}\0{stat.st_ctime_ns}\0{stat.st_ino}"
    )
    return hashlib.md5(identity.encode("utf-8", "surrogateescape"), usedforsecurity=False).hexdigest()


def _scan(dataset: IndexedDataset) -> int:
    """The .bin's largest id, a chunk at a time, with a progress line every few seconds."""
    tokens = dataset.num_tokens
    if tokens == 0:
        return -1
    print(
        f"gptrain: reading {dataset.bin_path} ({tokens:,} tokens) for its largest token id (once: "
        "it is kept beside the index caches)",
        file=sys.stderr,
        flush=True,
    )
    view = np.memmap(dataset.bin_path, dtype=dataset.dtype, mode="r", shape=(tokens,))
    progress = Progress(f"largest token id of {dataset.bin_path}", "tokens", total=tokens)
    largest = None
    for start in range(0, tokens, CHUNK_TOKENS):
        chunk = view[start : start + CHUNK_TOKENS]
        found = chunk.max()
        largest = found if largest is None else max(largest, found)
        progress.update(len(chunk), chunk.nbytes)
    return int(largest)


def check_ids_fit(
    prefixes: list[str], vocab_size: int, memo_dir_of: Callable[[str], str | None], where: str
) -> None:
    """Every dataset's ids below `vocab_size`, by the dtype's bound where it tells, else by reading
    the .bin (`memo_dir_of(prefix)`: where its largest id is kept); a DataError naming the file and
    its largest id otherwise (`where`: the config key or flag that named the data)."""
    for prefix in prefixes:
        dataset = IndexedDataset(prefix)
        bound = dtype_bound(dataset.dtype)
        if bound is not None and bound < vocab_size:
            continue
        largest = largest_token_id(dataset, memo_dir_of(prefix))
        if largest >= vocab_size:
            raise DataError(
                f"{where}: {dataset.bin_path} holds token id {largest}, but NullTokenizer's "
                f"model.tokenizer.vocab_size={vocab_size} has ids 0 to {vocab_size - 1}: give the vocab_size "
                f"of the tokenizer the data was made with (more than {largest}; Megatron's --vocab-size)"
            )
