"""GPT samples of `seq_length + 1` tokens drawn across documents, in Megatron-LM's exact order.

Three index arrays decide which tokens form sample i, built as Megatron's GPTDataset
builds them so the same config yields the same samples in the same order:

* document_index (int32): the split's sequence ids repeated once per epoch and shuffled;
  when the final epoch is only partly used it is shuffled separately, so the partial epoch
  does not concentrate on a random subset of the earlier epochs' documents.
* sample_index ([count+1, 2]): (position in document_index, token offset) where sample k
  starts; consecutive samples share one boundary token (the last label of k is the first
  input of k+1). Megatron walks the tokens in C++; here sample k starts at flat token
  position k*seq_length, so the rows come from one cumsum and one searchsorted.
* shuffle_index: a permutation of the samples (the partial final epoch shuffled apart).

One `numpy.random.RandomState(seed)` draws the document shuffles, then the sample shuffles.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import time
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from gptrain.data.index_cache import IndexCache, describe, file_fingerprint, remembered
from gptrain.errors import DataError

logger = logging.getLogger(__name__)

# Megatron separates the final epoch when it would use less than this fraction of an epoch.
FINAL_EPOCH_THRESHOLD = 0.80
# Megatron's pad id when the tokenizer has none; only appears if a sample runs out of tokens.
PAD_TOKEN_ID = -1
INDEX_NAMES = ("document_index", "sample_index", "shuffle_index")
# Documents per step while building the sample index: bounds the temporaries (~40 B each).
_INDEX_CHUNK = 1 << 18
# Sample rows per step within those documents: long documents hold many rows each (~24 B a row).
_ROW_CHUNK = 1 << 18
# Index entries per step while hashing or checking the documents of a split (8 MB of int64).
_HASH_CHUNK = 1 << 20
_MD5_HEX = re.compile(r"[0-9a-f]{32}")
# numpy's RandomState takes seeds in [0, 2**32), so Megatron's --seed has the same range.
MAX_SEED = 2**32 - 1


def seed_problem(seed: int) -> str | None:
    """Why `seed` cannot shuffle the data (the caller names its key or flag), or None."""
    if 0 <= seed <= MAX_SEED:
        return None
    return (
        f"{seed} is outside 0 to {MAX_SEED} (2**32 - 1, the range of numpy's RandomState that "
        "shuffles the data, as in Megatron); choose a seed in that range"
    )


class SequenceSource(Protocol):
    """What a GPTDataset needs from its IndexedDataset (a test may pass an in-memory one)."""

    path_prefix: str

    @property
    def sequence_lengths(self) -> np.ndarray: ...

    def get(self, idx: int, offset: int = 0, length: int | None = None) -> np.ndarray: ...

    def verify(self) -> None:
        """Raise a DataError if the index is inconsistent (run once, before indices are built)."""


# A split's sequence ids: a range (every split string gives one), or any array of ids.
Documents = range | np.ndarray


def as_documents(indices: range | np.ndarray | Any) -> Documents:
    """`indices` as a range when they are consecutive ascending ids, else as an array.

    A range costs nothing to keep and its cache key can be remembered (`documents_digest`);
    an array of 10^9 ids would stay resident at 4-8 GB per rank."""
    if isinstance(indices, range) and indices.step == 1:
        return indices
    array = np.asarray(indices)
    if array.ndim != 1 or array.dtype.kind not in "iu":
        return array
    if len(array) == 0:
        return range(0)
    first = int(array[0])
    if int(array[-1]) - first != len(array) - 1:
        return array
    for a in range(0, len(array), _HASH_CHUNK):
        chunk = array[a : a + _HASH_CHUNK].astype(np.int64, copy=False)
        if not np.array_equal(chunk, np.arange(first + a, first + a + len(chunk), dtype=np.int64)):
            return array
    return range(first, first + len(array))


def document_lengths(sequence_lengths: np.ndarray, documents: Documents) -> np.ndarray:
    """The lengths of the split's sequences (a view, not a copy, for a range)."""
    if isinstance(documents, range):
        return np.asarray(sequence_lengths)[documents.start : documents.stop]
    return np.asarray(sequence_lengths)[documents]


def num_epochs_for(tokens_per_epoch: int, num_samples: int | None, seq_length: int, extra: int) -> int:
    """Fewest whole epochs holding `num_samples` samples (1 when num_samples is None)."""
    if num_samples is None:
        return 1
    needed = num_samples * seq_length + extra
    return max(1, -(-needed // tokens_per_epoch))


def separate_final_epoch(
    tokens_per_epoch: int, num_epochs: int, num_samples: int | None, seq_length: int, extra: int
) -> tuple[bool, int]:
    """(whether the final epoch is shuffled apart, samples before the final epoch)."""
    if num_epochs == 1 or num_samples is None:
        return False, 0
    samples_before = ((num_epochs - 1) * tokens_per_epoch - extra) // seq_length
    samples_from_final = num_samples - samples_before
    samples_per_epoch = (tokens_per_epoch - extra) // seq_length
    return samples_from_final < int(FINAL_EPOCH_THRESHOLD * samples_per_epoch), samples_before


def build_document_index(
    documents: Documents, num_epochs: int, rng: np.random.RandomState, separate_final: bool
) -> np.ndarray:
    """The documents repeated per epoch (epoch-major) and shuffled, as int32.

    With `separate_final` the first num_epochs - 1 epochs are shuffled together, then the
    last on its own (the draws Megatron makes), in place in one array: no second copy."""
    last = (documents.stop - 1) if isinstance(documents, range) and len(documents) else None
    if last is None and len(documents):
        last = int(np.max(np.asarray(documents)))
    if last is not None and last > np.iinfo(np.int32).max:
        raise DataError(
            f"a split reaches sequence {last:,}, past the int32 ids of Megatron's document index "
            f"({np.iinfo(np.int32).max:,}): they would wrap to other sequences. Split the dataset into "
            "shards (prepare them separately) and blend them"
        )
    document_index = np.empty(num_epochs * len(documents), dtype=np.int32)
    epochs = document_index.reshape(num_epochs, len(documents))
    if isinstance(documents, range):
        for a in range(0, len(documents), _INDEX_CHUNK):
            stop = min(a + _INDEX_CHUNK, len(documents))
            epochs[:, a:stop] = np.arange(documents.start + a, documents.start + stop, dtype=np.int64)
    else:
        epochs[:] = np.asarray(documents)
    if separate_final and num_epochs > 1:
        split = (num_epochs - 1) * len(documents)
        rng.shuffle(document_index[:split])
        rng.shuffle(document_index[split:])
    else:
        rng.shuffle(document_index)
    return document_index


def build_sample_index(
    sequence_lengths: np.ndarray, document_index: np.ndarray, seq_length: int, num_epochs: int, extra: int
) -> np.ndarray:
    """Rows (document_index position, offset) where each sample starts, plus the end row.

    Sample j-1 covers flat tokens [(j-1)*s, j*s + extra); row j names the document holding
    that sample's last token (flat position j*s + extra - 1) with offset j*s minus the
    document's flat start: the rows Megatron's walk produces, also when a sample ends
    exactly at a document's end. Each row's document is found by its count of rows so far,
    a chunk of documents and a chunk of rows at a time, so memory beyond the output stays
    bounded also when a few book-length documents hold most of the rows.
    `num_epochs` is implied by document_index; it stays for parity with Megatron's helper.
    """
    sequence_lengths = np.asarray(sequence_lengths)
    total = sum(
        int(np.sum(sequence_lengths[document_index[a : a + _INDEX_CHUNK]], dtype=np.int64))
        for a in range(0, len(document_index), _INDEX_CHUNK)
    )
    count = max(0, (total - extra) // seq_length)
    largest = max(len(document_index), int(np.max(sequence_lengths, initial=0)))
    dtype = np.int32 if largest <= np.iinfo(np.int32).max else np.int64
    sample_index = np.zeros((count + 1, 2), dtype=dtype)
    # Rows j >= 0 whose last token lies at or before flat position x - 1: (x - extra) // s + 1.
    # Document k holds rows [rows_upto(its start), rows_upto(its end)); row 0 is the zero row.
    start, first_row = 0, (0 - extra) // seq_length + 1
    for a in range(0, len(document_index), _INDEX_CHUNK):
        lengths = sequence_lengths[document_index[a : a + _INDEX_CHUNK]].astype(np.int64)
        ends = np.cumsum(lengths)
        ends += start
        starts = ends - lengths
        rows_upto = (ends - extra) // seq_length + 1
        last = min(int(rows_upto[-1]), count + 1)
        for lo in range(max(first_row, 1), last, _ROW_CHUNK):
            hi = min(lo + _ROW_CHUNK, last)
            row = np.arange(lo, hi, dtype=np.int64)
            # document k of the chunk holds rows [rows_upto[k-1], rows_upto[k])
            position = np.searchsorted(rows_upto, row, side="right")
            sample_index[lo:hi, 0] = position + a
            sample_index[lo:hi, 1] = row * seq_length - starts[position]
        start, first_row = int(ends[-1]), int(rows_upto[-1])
    return sample_index


def build_shuffle_index(num_first: int, total: int, rng: np.random.RandomState) -> np.ndarray:
    """Permutation of [0, total) with [0, num_first) and [num_first, total) shuffled apart."""
    dtype = np.int64 if total >= np.iinfo(np.uint32).max - 1 else np.uint32
    shuffle_index = np.arange(total, dtype=dtype)
    rng.shuffle(shuffle_index[:num_first])
    if num_first < total:
        rng.shuffle(shuffle_index[num_first:])
    return shuffle_index


def build_gpt_indices(
    sequence_lengths: np.ndarray,
    documents: Documents,
    num_samples: int | None,
    seq_length: int,
    seed: int,
    add_extra_token: bool = True,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(document_index, sample_index, shuffle_index) for one split, as Megatron builds them."""
    extra = int(add_extra_token)
    tokens_per_epoch = int(np.sum(document_lengths(sequence_lengths, documents), dtype=np.int64))
    if tokens_per_epoch <= extra:
        raise DataError(
            f"a split of {len(documents)} sequences holds {tokens_per_epoch} tokens; it needs more "
            "data or a different split string"
        )
    epochs = num_epochs_for(tokens_per_epoch, num_samples, seq_length, extra)
    separate, samples_before = separate_final_epoch(tokens_per_epoch, epochs, num_samples, seq_length, extra)
    rng = np.random.RandomState(seed)
    document_index = build_document_index(documents, epochs, rng, separate)
    sample_index = build_sample_index(sequence_lengths, document_index, seq_length, epochs, extra)
    count = sample_index.shape[0] - 1
    shuffle_index = build_shuffle_index(samples_before if separate else count, count, rng)
    return document_index, sample_index, shuffle_index


@dataclass(frozen=True)
class SampleLocation:
    """Where sample i comes from: the unshuffled sample id and its document pieces."""

    sample: int
    documents: list[int]
    first_offset: int
    last_length: int


class GPTDataset:
    """Samples of one split of one IndexedDataset; `ds[i]` is `seq_length + extra` int64 ids.

    `indices` (the split's sequence ids) are kept as a range when consecutive (`as_documents`)."""

    def __init__(
        self,
        indexed: SequenceSource | str,
        indices: Documents,
        num_samples: int | None,
        seq_length: int,
        seed: int,
        split: str,
        cache_dir: str | None = None,
        add_extra_token_to_sequence: bool = True,
        use_cache: bool = True,
    ) -> None:
        if isinstance(indexed, str):
            from gptrain.data.indexed import IndexedDataset

            indexed = IndexedDataset(indexed)
        if seq_length < 2:
            raise DataError(f"seq_length must be at least 2, got {seq_length}")
        if (problem := seed_problem(seed)) is not None:
            raise DataError(f"seed: {problem}")
        self.dataset = indexed
        self.indices = as_documents(indices)
        self.num_samples, self.seq_length, self.seed, self.split = num_samples, seq_length, seed, split
        self.extra = int(add_extra_token_to_sequence)
        self.cache_dir = (
            (cache_dir or default_cache_dir(indexed.path_prefix, type(self).__name__)) if use_cache else None
        )
        self.cache_hit = False
        self.document_index, self.sample_index, self.shuffle_index = self._load_or_build()

    @cached_property
    def _key(self) -> tuple[str, str]:
        return describe(self.identity())

    @property
    def description(self) -> str:
        """The JSON of `identity()`, saved next to the cached indices (and nested in a blend's)."""
        return self._key[0]

    @property
    def digest(self) -> str:
        """md5 of the description: the cached files' name."""
        return self._key[1]

    def identity(self) -> dict[str, Any]:
        """Everything that determines the indices (the cache key).

        The data enter by the .idx's digest (`file_fingerprint`), not its path or mtime, so a
        copy finds the cache built from the original; "indices" is [first id, count, md5 of the
        ids as int64]."""
        indices = self.indices
        return {
            "class": type(self).__name__,
            **file_fingerprint(self.dataset.path_prefix, self.cache_dir),
            "num_sequences": int(len(self.dataset.sequence_lengths)),
            "index_split": self.split,
            "indices": [
                int(indices[0]) if len(indices) else 0,
                len(indices),
                documents_digest(indices, self.cache_dir),
            ],
            "num_samples": self.num_samples,
            "sequence_length": self.seq_length,
            "random_seed": self.seed,
            "add_extra_token_to_sequence": bool(self.extra),
        }

    def _load_or_build(self) -> tuple[np.ndarray, ...]:
        cache = None
        if self.cache_dir is not None:
            cache = IndexCache(self.cache_dir, self.digest, type(self).__name__, self.split)
            cached = cache.load(INDEX_NAMES, self._cache_problem)
            if cached is not None:
                self.cache_hit = True
                logger.info("loaded %s %s indices from %s", type(self).__name__, self.split, self.cache_dir)
                return tuple(cached[name] for name in INDEX_NAMES)
        start = time.perf_counter()
        # Once per build, not per open: a wrong pointer would silently mix documents.
        self.dataset.verify()
        try:
            arrays = build_gpt_indices(
                self.dataset.sequence_lengths,
                self.indices,
                self.num_samples,
                self.seq_length,
                self.seed,
                bool(self.extra),
            )
        except DataError as error:
            raise DataError(f"{self.dataset.path_prefix} ({self.split} split): {error}") from None
        logger.info(
            "built %s %s indices: %d samples in %.3f s",
            type(self).__name__,
            self.split,
            arrays[1].shape[0] - 1,
            time.perf_counter() - start,
        )
        if cache is not None:
            cache.save(dict(zip(INDEX_NAMES, arrays, strict=True)), self.description)
        return arrays

    def _cache_problem(self, arrays: dict[str, np.ndarray]) -> str | None:
        """Why cached arrays cannot be this dataset's indices (O(1): they may be gigabytes), or None."""
        documents, samples, shuffle = (arrays[name] for name in INDEX_NAMES)
        if documents.ndim != 1 or len(self.indices) == 0 or len(documents) % len(self.indices):
            return (
                f"document_index has shape {documents.shape}, expected epochs x {len(self.indices)} entries"
            )
        if samples.ndim != 2 or samples.shape[0] < 1 or samples.shape[1] != 2:
            return f"sample_index has shape {samples.shape}, expected (samples + 1, 2)"
        if shuffle.shape != (samples.shape[0] - 1,):
            return f"shuffle_index has shape {shuffle.shape}, expected ({samples.shape[0] - 1},)"
        # Column 0 never decreases, so its last entry is its largest.
        if not 0 <= int(samples[-1, 0]) < len(documents):
            return f"sample_index ends at document_index position {int(samples[-1, 0])} of {len(documents)}"
        return None

    def __len__(self) -> int:
        return int(self.sample_index.shape[0]) - 1

    @property
    def num_epochs(self) -> int:
        """Passes over the split's documents that its samples take (Megatron's "total number of epochs")."""
        return len(self.document_index) // max(1, len(self.indices))

    def locate(self, idx: int) -> SampleLocation:
        """The unshuffled sample and the document pieces that make up sample `idx`."""
        if not -len(self) <= idx < len(self):
            raise IndexError(f"sample {idx} out of range for {len(self)} samples")
        sample = int(self.shuffle_index[idx])
        first, first_offset = (int(v) for v in self.sample_index[sample])
        last, last_offset = (int(v) for v in self.sample_index[sample + 1])
        documents = [int(d) for d in self.document_index[first : last + 1]]
        last_length = last_offset + self.extra - (first_offset if first == last else 0)
        return SampleLocation(sample, documents, first_offset, last_length)

    def __getitem__(self, idx: int) -> np.ndarray:
        where = self.locate(int(idx))
        parts = []
        for position, document in enumerate(where.documents):
            offset = where.first_offset if position == 0 else 0
            is_last = position == len(where.documents) - 1
            parts.append(
                self.dataset.get(document, offset=offset, length=where.last_length if is_last else None)
            )
        tokens = np.concatenate(parts).astype(np.int64)
        wanted = self.seq_length + self.extra
        if len(tokens) < wanted:
            tokens = np.concatenate((tokens, np.full(wanted - len(tokens), PAD_TOKEN_ID, dtype=np.int64)))
        return tokens


def documents_digest(documents: Documents, memo_dir: str | os.PathLike[str] | None = None) -> str:
    """md5 of the documents' ids as one C-contiguous int64 array, hashed a chunk at a time.

    The digest is that of the whole int64 array (the cache key since the first release) without
    ever holding it: a split of 10^9 documents took 8 GB beyond its ids and ~15 s at every start.
    A range's digest depends only on its ends, so it is kept in `memo_dir` once computed."""
    md5 = hashlib.md5(usedforsecurity=False)
    if not isinstance(documents, range) or documents.step != 1:
        for a in range(0, len(documents), _HASH_CHUNK):
            md5.update(np.ascontiguousarray(documents[a : a + _HASH_CHUNK], dtype=np.int64))
        return md5.hexdigest()
    start, stop = documents.start, documents.stop

    def compute() -> str:
        for a in range(start, stop, _HASH_CHUNK):
            md5.update(np.arange(a, min(a + _HASH_CHUNK, stop), dtype=np.int64))
        return md5.hexdigest()

    if memo_dir is None or len(documents) < _HASH_CHUNK:
        return compute()
    return remembered(Path(memo_dir, f"range-{start}-{stop}-int64.md5"), compute, _MD5_HEX)


def default_cache_dir(path_prefix: str, kind: str) -> str:
    """`<directory of the prefix>/cache/<kind>_indices`, next to the data like Megatron's."""
    return os.path.join(os.path.dirname(os.path.abspath(path_prefix)), "cache", f"{kind}_indices")
