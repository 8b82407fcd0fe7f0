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
import time
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from gptrain.data.index_cache import IndexCache, describe, file_fingerprint
from gptrain.errors import DataError

logger = logging.getLogger(__name__)

# Megatron separates the final epoch when it would use less than this fraction of an epoch.
FINAL_EPOCH_THRESHOLD = 0.80
# Megatron's pad id when the tokenizer has none; only appears if a sample runs out of tokens.
PAD_TOKEN_ID = -1
INDEX_NAMES = ("document_index", "sample_index", "shuffle_index")


class SequenceSource(Protocol):
    """What a GPTDataset needs from its IndexedDataset (a test may pass an in-memory one)."""

    path_prefix: str

    @property
    def sequence_lengths(self) -> np.ndarray: ...

    def get(self, idx: int, offset: int = 0, length: int | None = None) -> np.ndarray: ...

    def verify(self) -> None:
        """Raise a DataError if the index is inconsistent (run once, before indices are built)."""


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
    documents: np.ndarray, num_epochs: int, rng: np.random.RandomState, separate_final: bool
) -> np.ndarray:
    """The documents repeated per epoch (epoch-major) and shuffled, as int32."""
    if separate_final and num_epochs > 1:
        first = build_document_index(documents, num_epochs - 1, rng, False)
        last = build_document_index(documents, 1, rng, False)
        return np.concatenate((first, last))
    document_index = np.tile(np.asarray(documents).astype(np.int32), num_epochs)
    rng.shuffle(document_index)
    return document_index


def build_sample_index(
    sequence_lengths: np.ndarray, document_index: np.ndarray, seq_length: int, num_epochs: int, extra: int
) -> np.ndarray:
    """Rows (document_index position, offset) where each sample starts, plus the end row.

    Sample j-1 covers flat tokens [(j-1)*s, j*s + extra); row j names the document holding
    that sample's last token (flat position j*s + extra - 1) with offset j*s minus the
    document's flat start: the rows Megatron's walk produces, also when a sample ends
    exactly at a document's end. Rows are counted per document (`repeat`), not searched.
    `num_epochs` is implied by document_index; it stays for parity with Megatron's helper.
    """
    lengths = np.asarray(sequence_lengths)[document_index]
    ends = np.cumsum(lengths, dtype=np.int64)
    total = int(ends[-1]) if len(ends) else 0
    count = max(0, (total - extra) // seq_length)
    # Rows j >= 0 whose last token lies at or before flat position x - 1: (x - extra) // s + 1.
    rows_upto = np.empty(len(ends) + 1, dtype=np.int64)
    rows_upto[0] = (0 - extra) // seq_length + 1
    np.subtract(ends, extra, out=rows_upto[1:])
    np.floor_divide(rows_upto[1:], seq_length, out=rows_upto[1:])
    rows_upto[1:] += 1
    first = 1 - int(rows_upto[0])  # row 0 is counted too when extra == 1: skip it
    rows_per_document = np.diff(rows_upto)
    del rows_upto
    position_dtype = np.int32 if len(ends) <= np.iinfo(np.int32).max else np.int64
    position = np.repeat(np.arange(len(ends), dtype=position_dtype), rows_per_document)[first : first + count]
    del rows_per_document
    np.subtract(ends, lengths, out=ends)  # now the flat start of each document
    del lengths
    largest = max(len(document_index), int(np.max(sequence_lengths, initial=0)))
    dtype = np.int32 if largest <= np.iinfo(np.int32).max else np.int64
    sample_index = np.zeros((count + 1, 2), dtype=dtype)
    sample_index[1:, 0] = position
    offsets = np.arange(seq_length, (count + 1) * seq_length, seq_length, dtype=np.int64)
    offsets -= ends[position]
    sample_index[1:, 1] = offsets
    return sample_index


def build_shuffle_index(num_first: int, total: int, rng: np.random.RandomState) -> np.ndarray:
    """Permutation of [0, total) with [0, num_first) and [num_first, total) shuffled apart."""
    dtype = np.int64 if total >= np.iinfo(np.uint32).max - 1 else np.uint32
    first = np.arange(num_first, dtype=dtype)
    rng.shuffle(first)
    if num_first == total:
        return first
    last = np.arange(num_first, total, dtype=dtype)
    rng.shuffle(last)
    return np.concatenate((first, last))


def build_gpt_indices(
    sequence_lengths: np.ndarray,
    documents: np.ndarray,
    num_samples: int | None,
    seq_length: int,
    seed: int,
    add_extra_token: bool = True,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(document_index, sample_index, shuffle_index) for one split, as Megatron builds them."""
    extra = int(add_extra_token)
    tokens_per_epoch = int(np.sum(np.asarray(sequence_lengths)[documents], dtype=np.int64))
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
    """Samples of one split of one IndexedDataset; `ds[i]` is `seq_length + extra` int64 ids."""

    def __init__(
        self,
        indexed: SequenceSource | str,
        indices: np.ndarray,
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
        self.dataset = indexed
        self.indices = np.asarray(indices)
        self.num_samples, self.seq_length, self.seed, self.split = num_samples, seq_length, seed, split
        self.extra = int(add_extra_token_to_sequence)
        self.description, self.digest = describe(self.identity())
        self.cache_hit = False
        self.document_index, self.sample_index, self.shuffle_index = self._load_or_build(cache_dir, use_cache)

    def identity(self) -> dict[str, Any]:
        """Everything that determines the indices (the cache key)."""
        indices = np.ascontiguousarray(self.indices, dtype=np.int64)
        return {
            "class": type(self).__name__,
            **file_fingerprint(self.dataset.path_prefix),
            "num_sequences": int(len(self.dataset.sequence_lengths)),
            "index_split": self.split,
            "indices": [int(indices[0]) if len(indices) else 0, len(indices), describe_array(indices)],
            "num_samples": self.num_samples,
            "sequence_length": self.seq_length,
            "random_seed": self.seed,
            "add_extra_token_to_sequence": bool(self.extra),
        }

    def _load_or_build(self, cache_dir: str | None, use_cache: bool) -> tuple[np.ndarray, ...]:
        cache = None
        if use_cache:
            directory = cache_dir or default_cache_dir(self.dataset.path_prefix, type(self).__name__)
            cache = IndexCache(directory, self.digest, type(self).__name__, self.split)
            cached = cache.load(INDEX_NAMES)
            if cached is not None:
                self.cache_hit = True
                logger.info("loaded %s %s indices from %s", type(self).__name__, self.split, directory)
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

    def __len__(self) -> int:
        return int(self.sample_index.shape[0]) - 1

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


def describe_array(array: np.ndarray) -> str:
    """md5 of an index array: splits are ranges, but callers may pass any subset of sequences."""
    return hashlib.md5(np.ascontiguousarray(array).tobytes(), usedforsecurity=False).hexdigest()


def default_cache_dir(path_prefix: str, kind: str) -> str:
    """`<directory of the prefix>/cache/<kind>_indices`, next to the data like Megatron's."""
    return os.path.join(os.path.dirname(os.path.abspath(path_prefix)), "cache", f"{kind}_indices")
