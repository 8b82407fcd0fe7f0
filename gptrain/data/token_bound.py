"""Whether a dataset's token ids fit a vocabulary of `vocab_size` ids (no torch).

NullTokenizer has no files to say what ids the data holds: an id past --vocab-size would index past
the embedding's rows (Megatron then fails deep in a CUDA kernel, or trains on a padding row). Before
training, the .idx's token dtype bounds the ids for free (uint16 data never holds 65,536 or more);
where it does not, .bin files of model.data.token_scan_limit_gb (SCAN_LIMIT_BYTES) or less in all are read, and their largest id kept
beside the index caches under the .bin's identity on disk, so that later starts (and the other ranks,
which build after rank 0) read one number instead. A larger corpus is not read at the start (tens of
minutes on a parallel file system, while the other ranks wait in the dataset-building turns): its ids
are checked sample by sample as the batches are made (`past_vocabulary`, train/batches.py).
"""

from __future__ import annotations

import hashlib
import os
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from gptrain.data.index_cache import remembered
from gptrain.data.indexed import IndexedDataset, map_error
from gptrain.errors import DataError
from gptrain.utils.progress import Progress
from gptrain.utils.rank import is_rank_zero

CHUNK_TOKENS = 1 << 26  # 128 MiB of uint16, 256 MiB of int32: memory stays flat
# The most .bin bytes read at the start. The scan's max runs at 5.7 (int32) to 7.5 (uint16) GB/s in
# memory; a parallel file system gives a node 1-2 GB/s: 4 GiB take 0.7 s cached, 2 to 4.3 s from it.
SCAN_LIMIT_BYTES = 4 << 30
_INTEGER = re.compile(r"-?[0-9]+")


def dtype_bound(dtype: np.dtype) -> int | None:
    """The largest id a token dtype can hold; None for a float dtype (the .bin is read then)."""
    return int(np.iinfo(dtype).max) if np.issubdtype(dtype, np.integer) else None


def largest_token_id(dataset: IndexedDataset, memo_dir: str | None = None) -> int:
    """The largest id in the dataset's .bin (-1 when it holds none), read once and kept in `memo_dir`."""
    memo = _memo_path(str(dataset.bin_path), memo_dir)
    return int(remembered(memo, lambda: str(_scan(dataset)), _INTEGER))


def kept_largest_id(dataset: IndexedDataset, memo_dir: str | None) -> int | None:
    """The largest id a completed scan kept for this .bin as it is on disk, or None (never read)."""
    memo = _memo_path(str(dataset.bin_path), memo_dir)
    if memo is None:
        return None
    try:
        text = memo.read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError):
        return None
    return int(text) if _INTEGER.fullmatch(text) else None


def _memo_path(bin_path: str, memo_dir: str | None) -> Path | None:
    return Path(memo_dir, f"bin-{_identity(bin_path)}.largest-id") if memo_dir is not None else None


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
    try:  # a map of its own: past the open-file or memory-map limit this one fails
        view = np.memmap(dataset.bin_path, dtype=dataset.dtype, mode="r", shape=(tokens,))
    except OSError as error:
        raise map_error(dataset.bin_path, error) from None
    progress = Progress(f"largest token id of {dataset.bin_path}", "tokens", total=tokens)
    largest = None
    for start in range(0, tokens, CHUNK_TOKENS):
        chunk = view[start : start + CHUNK_TOKENS]
        found = chunk.max()
        largest = found if largest is None else max(largest, found)
        progress.update(len(chunk), chunk.nbytes)
    return int(largest)


def check_ids_fit(
    prefixes: list[str],
    vocab_size: int,
    memo_dir_of: Callable[[str], str | None],
    where: str,
    limit_gb: float | None = None,
) -> None:
    """Every dataset's ids below `vocab_size` where that costs little: by the dtype's bound, by a
    kept scan, else by reading the .bins if they hold `limit_gb` GiB (model.data.token_scan_limit_gb;
    None: SCAN_LIMIT_BYTES) or less in all (`memo_dir_of(prefix)`: where a largest id is kept);
    larger ones are left to the per-sample check, said in a note. A DataError naming the file and
    its largest id (`where`: the config key or flag that named the data)."""
    unread: list[tuple[IndexedDataset, str | None]] = []
    for prefix in prefixes:
        dataset = IndexedDataset(prefix)
        bound = dtype_bound(dataset.dtype)
        if bound is not None and bound < vocab_size:
            continue
        memo_dir = memo_dir_of(prefix)
        kept = kept_largest_id(dataset, memo_dir)
        if kept is not None:
            _refuse_past(str(dataset.bin_path), kept, vocab_size, where)
        else:
            unread.append((dataset, memo_dir))
    size = sum(os.path.getsize(dataset.bin_path) for dataset, _ in unread)
    limit = SCAN_LIMIT_BYTES if limit_gb is None else int(limit_gb * 2**30)
    if unread and size > limit:
        _note_checked_as_read(len(unread), size, vocab_size, where, limit_gb)
        return
    for dataset, memo_dir in unread:
        _refuse_past(str(dataset.bin_path), largest_token_id(dataset, memo_dir), vocab_size, where)


def _note_checked_as_read(files: int, size: int, vocab_size: int, where: str, limit_gb: float | None) -> None:
    """Rank 0's one line on the .bins left to the per-sample check (each rank reaches here)."""
    if not is_rank_zero():
        return
    if limit_gb == 0:
        why = "model.data.token_scan_limit_gb=0"
    else:
        limit = f"{SCAN_LIMIT_BYTES / 2**30:g}" if limit_gb is None else f"{limit_gb:g}"
        why = f"more than model.data.token_scan_limit_gb={limit} GiB"
    print(
        f"gptrain: note: {where}: {files} .bin file(s) of {size / 2**30:,.1f} GiB whose token dtype holds "
        f"ids past NullTokenizer's model.tokenizer.vocab_size={vocab_size} are not read at the start ({why}): "
        "their ids are checked as samples are read, and an id past the vocabulary stops the run naming "
        "its .bin; raise the limit to read them once, before the first step",
        file=sys.stderr,
        flush=True,
    )


def _refuse_past(bin_path: str, largest: int, vocab_size: int, where: str) -> None:
    if largest >= vocab_size:
        raise past_vocabulary_error(bin_path, largest, vocab_size, where)


def past_vocabulary_error(holder: str, token_id: int, vocab_size: int, where: str, at: str = "") -> DataError:
    """The one line for id `token_id` of `holder` (a .bin; found `at` a place in it) past the vocabulary."""
    return DataError(
        f"{where}: {holder} holds token id {token_id}{at}, but NullTokenizer's "
        f"model.tokenizer.vocab_size={vocab_size} has ids 0 to {vocab_size - 1}: give the vocab_size "
        f"of the tokenizer the data was made with (more than {token_id}; Megatron's --vocab-size)"
    )


def sample_past_vocabulary(samples: Any, index: int, largest: int, vocab_size: int, where: str) -> DataError:
    """The one line for sample `index` of `samples` (a GPTDataset or a blend of them) holding id
    `largest` past the vocabulary: the sample is read again to name the .bin, document and token
    where the first such id is (only on the error, so the per-sample check stays one max)."""
    found = _first_past(samples, index, vocab_size)
    if found is None:
        return past_vocabulary_error(f"sample {index}", largest, vocab_size, where)
    bin_path, document, offset, token_id = found
    at = f" (document {document}, token {offset}; sample {index})"
    return past_vocabulary_error(bin_path, token_id, vocab_size, where, at)


def _first_past(samples: Any, index: int, vocab_size: int) -> tuple[str, int, int, int] | None:
    """(.bin, document, token offset in it, id) of the sample's first id past `vocab_size`; None
    for samples of another kind."""
    from gptrain.data.blended import BlendedDataset
    from gptrain.data.gpt_dataset import GPTDataset

    while isinstance(samples, BlendedDataset):
        child, index = samples.locate(index)
        samples = samples.datasets[child]
    if not isinstance(samples, GPTDataset):
        return None
    where = samples.locate(index)
    for position, document in enumerate(where.documents):
        offset = where.first_offset if position == 0 else 0
        length = where.last_length if position == len(where.documents) - 1 else None
        piece = samples.dataset.get(document, offset=offset, length=length)
        past = np.flatnonzero(piece >= vocab_size)
        if len(past):
            return str(samples.dataset.bin_path), document, offset + int(past[0]), int(piece[past[0]])
    return None
