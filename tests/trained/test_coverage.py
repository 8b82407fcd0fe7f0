"""Distinct tokens read by the first samples of a dataset, against a brute-force count.

Every token of the test data is a different value (its position in the data), so the set of
values the samples hold is the set of tokens they read.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from gptrain.data.blended import BlendedDataset
from gptrain.data.gpt_dataset import GPTDataset
from gptrain.data.indexed import IndexedDataset, IndexedDatasetWriter
from gptrain.data.mock import MockGPTDataset
from gptrain.trained.coverage import coverage

SEQ = 8


def numbered_data(prefix: Path, lengths: list[int], start: int = 0) -> IndexedDataset:
    """Documents of these lengths whose tokens are start, start+1, ...: all different."""
    writer = IndexedDatasetWriter(str(prefix), np.int32)
    for length in lengths:
        writer.add_document(np.arange(start, start + length, dtype=np.int32))
        start += length
    writer.finalize()
    return IndexedDataset(str(prefix))


def brute_force(samples, count: int) -> int:
    """Different tokens among the inputs (the first SEQ of SEQ + 1) of samples [0, count)."""
    return len({int(t) for i in range(count) for t in samples[i][:SEQ]})


LENGTHS = [5, 17, 3, 30, 9, 1, 12]  # 77 tokens: 9 samples of 8 (+1) per epoch


@pytest.mark.parametrize(
    ("num_samples", "count"),
    [
        (9, 9),  # one epoch, all of it: nothing repeats
        (9, 4),
        (40, 40),  # 5 epochs, the last separate
        (25, 25),  # 3 epochs shuffled together
        (25, 7),  # shuffled together: fewer than an epoch's samples may still repeat tokens
        (200, 150),
    ],
)
def test_distinct_tokens_of_a_dataset_match_a_brute_force_count(tmp_path, num_samples, count) -> None:
    data = numbered_data(tmp_path / "docs", LENGTHS)
    dataset = GPTDataset(data, np.arange(len(LENGTHS)), num_samples, SEQ, 3, "valid", use_cache=False)
    read = coverage(dataset, count)
    assert read is not None
    assert read.data_tokens == sum(LENGTHS)
    assert read.read_tokens == count * SEQ
    assert read.distinct_tokens == brute_force(dataset, count)
    if num_samples == 9:
        assert read.distinct_tokens == read.read_tokens  # one epoch never repeats a token


def test_a_split_of_some_documents_counts_only_its_own(tmp_path) -> None:
    data = numbered_data(tmp_path / "docs", LENGTHS)
    dataset = GPTDataset(data, np.array([1, 3, 4]), 20, SEQ, 5, "valid", use_cache=False)
    read = coverage(dataset, 20)
    assert read is not None
    assert read.data_tokens == 17 + 30 + 9
    assert read.distinct_tokens == brute_force(dataset, 20) <= 56


def test_a_blend_adds_up_its_datasets(tmp_path) -> None:
    first = numbered_data(tmp_path / "a", LENGTHS)
    second = numbered_data(tmp_path / "b", [40, 7, 22], start=1000)
    children = [
        GPTDataset(first, np.arange(len(LENGTHS)), 30, SEQ, 1, "valid", use_cache=False),
        GPTDataset(second, np.arange(3), 30, SEQ, 1, "valid", use_cache=False),
    ]
    blend = BlendedDataset(children, [0.7, 0.3], 30, "valid", use_cache=False)
    read = coverage(blend, 30)
    assert read is not None
    assert read.data_tokens == sum(LENGTHS) + 69
    assert read.read_tokens == 30 * SEQ
    assert read.distinct_tokens == brute_force(blend, 30)


def test_the_repeats_warning_of_a_blend_read_less_than_once_says_so(tmp_path) -> None:
    """A blend whose small dataset wraps while its large one is barely read: fewer tokens read than
    the data holds, some of them twice. The warning said "read them 0.27 times over"."""
    from gptrain.trained.evaluate import repeats_warning

    small = numbered_data(tmp_path / "small", LENGTHS)
    large = numbered_data(tmp_path / "large", [400], start=1000)
    children = [
        GPTDataset(small, np.arange(len(LENGTHS)), 30, SEQ, 1, "valid", use_cache=False),
        GPTDataset(large, np.arange(1), 30, SEQ, 1, "valid", use_cache=False),
    ]
    blend = BlendedDataset(children, [0.9, 0.1], 16, "valid", use_cache=False)
    read = coverage(blend, 16)
    assert read is not None
    assert read.read_tokens == 16 * SEQ < read.data_tokens == 77 + 400
    distinct = brute_force(blend, 16)
    assert read.distinct_tokens == distinct < read.read_tokens
    assert repeats_warning(read, 4, "blend") == (
        f"gptrain: warning: blend: 477 tokens; 4 batches read 128 of them, yet only {distinct} distinct "
        "(a blend's smaller dataset, or a split shuffled over several epochs, repeats before all is read): "
        "the loss counts the repeated tokens again"
    )


def test_mock_data_has_no_coverage() -> None:
    assert coverage(MockGPTDataset(10, SEQ, 50), 10) is None
