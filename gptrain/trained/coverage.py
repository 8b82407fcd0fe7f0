"""How much of a dataset the first samples of an evaluation read, counting each token once.

A split sized for more samples than one pass holds is built over several epochs (Megatron's
GPTDataset, and so evaluation, wraps around): its samples then repeat tokens. The distinct
tokens are counted exactly from the index arrays: sample k reads the flat token positions
[k*seq, (k+1)*seq) of the epochs' concatenated documents, each position a (document, offset)
of the data; the union of those pieces, per document, is what was read at least once.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass(frozen=True)
class Coverage:
    data_tokens: int
    """Tokens the data holds (one epoch of each dataset)."""
    read_tokens: int
    """Token positions the samples read: samples x seq_length, repeats included."""
    distinct_tokens: int
    """Of those, the different tokens of the data."""


def coverage(samples: Any, count: int) -> Coverage | None:
    """The coverage of samples [0, count) of a GPTDataset or BlendedDataset; None for other data (mock)."""
    from gptrain.data.blended import BlendedDataset
    from gptrain.data.gpt_dataset import GPTDataset

    count = min(count, len(samples))
    if isinstance(samples, GPTDataset):
        return Coverage(*_gpt_coverage(samples, np.asarray(samples.shuffle_index[:count], dtype=np.int64)))
    if isinstance(samples, BlendedDataset) and all(isinstance(d, GPTDataset) for d in samples.datasets):
        which = np.asarray(samples.dataset_index[:count])
        within = np.asarray(samples.dataset_sample_index[:count], dtype=np.int64)
        totals = np.zeros(3, dtype=np.int64)
        for number, child in enumerate(samples.datasets):
            unshuffled = np.asarray(child.shuffle_index[within[which == number]], dtype=np.int64)
            totals += _gpt_coverage(child, unshuffled)
        return Coverage(int(totals[0]), int(totals[1]), int(totals[2]))
    return None


def _gpt_coverage(dataset: Any, unshuffled: np.ndarray) -> tuple[int, int, int]:
    """(tokens of one epoch, positions read, distinct tokens read) of these unshuffled samples."""
    from gptrain.data.gpt_dataset import document_lengths

    lengths = dataset.dataset.sequence_lengths  # memory-mapped: index first, then widen what is read
    split = int(document_lengths(lengths, dataset.indices).sum(dtype=np.int64))
    if len(unshuffled) == 0:
        return split, 0, 0
    starts = np.asarray(dataset.sample_index[unshuffled], dtype=np.int64)
    ends = np.asarray(dataset.sample_index[unshuffled + 1], dtype=np.int64)
    # one piece per document a sample touches: from its start offset (first) to its end offset (last)
    pieces = ends[:, 0] - starts[:, 0] + 1
    first = np.repeat(np.cumsum(pieces) - pieces, pieces)
    step = np.arange(int(pieces.sum())) - first
    position = np.repeat(starts[:, 0], pieces) + step
    document = np.asarray(dataset.document_index[position], dtype=np.int64)
    begin = np.where(step == 0, np.repeat(starts[:, 1], pieces), 0)
    is_last = step == np.repeat(pieces - 1, pieces)
    end = np.where(is_last, np.repeat(ends[:, 1], pieces), np.asarray(lengths[document], dtype=np.int64))
    return split, len(unshuffled) * dataset.seq_length, _union_length(document, begin, end)


def _union_length(document: np.ndarray, begin: np.ndarray, end: np.ndarray) -> int:
    """Tokens in the union of the pieces [begin, end) of each document."""
    stride = int(np.max(end, initial=0)) + 1  # documents laid end to end on one line, apart (ends bound them)
    lo, hi = document * stride + begin, document * stride + end
    order = np.argsort(lo, kind="stable")
    lo, hi = lo[order], hi[order]
    reach = np.maximum.accumulate(hi)  # furthest covered point so far
    before = np.concatenate(([np.iinfo(np.int64).min], reach[:-1]))
    return int(np.clip(hi - np.maximum(lo, before), 0, None).sum())
