"""GPTDataset's document, sample and shuffle indices against the construction of the spec
(megatron-data-format.md, section 7), written here from the spec alone: epochs, the final-epoch
separation rule, one RandomState drawn in order, the sample walk, the dtypes; and each item the
`seq_length + 1` tokens the spec's walk names. Drawn by hypothesis."""

from __future__ import annotations

import numpy as np
from gpt_data_helpers import InMemorySequences
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from gptrain.data.gpt_dataset import GPTDataset, build_gpt_indices

INT32_MAX = 2**31 - 1


def spec_epochs(tokens_per_epoch: int, num_samples: int | None, seq: int, extra: int) -> int:
    epochs = 1
    if num_samples is not None:
        while epochs * tokens_per_epoch < num_samples * seq + extra:
            epochs += 1
    return epochs


def spec_separation(
    tokens: int, epochs: int, num_samples: int | None, seq: int, extra: int
) -> tuple[bool, int]:
    if epochs == 1 or num_samples is None:
        return False, 0
    before = ((epochs - 1) * tokens - extra) // seq
    per_epoch = (tokens - extra) // seq
    return num_samples - before < int(0.8 * per_epoch), before


def spec_walk(lengths: list[int], document_index: list[int], seq: int, extra: int) -> list[tuple[int, int]]:
    """Rows of the sample index: consume seq + extra tokens from (position, offset); a document that
    covers the rest keeps the walk, at its offset plus the tokens still needed less the extra."""
    count = (sum(lengths[d] for d in document_index) - extra) // seq
    rows, position, offset = [(0, 0)], 0, 0
    for _ in range(count):
        remaining = seq + extra
        while remaining:
            left = lengths[document_index[position]] - offset
            remaining -= left
            if remaining <= 0:
                offset += remaining + left - extra
                remaining = 0
            else:
                position, offset = position + 1, 0
        rows.append((position, offset))
    return rows


def spec_indices(
    lengths: list[int], documents: list[int], num_samples: int | None, seq: int, seed: int, extra: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    tokens = sum(lengths[d] for d in documents)
    epochs = spec_epochs(tokens, num_samples, seq, extra)
    separate, before = spec_separation(tokens, epochs, num_samples, seq, extra)
    rng = np.random.RandomState(seed)
    if separate:
        first = np.array(documents * (epochs - 1), dtype=np.int32)
        rng.shuffle(first)
        last = np.array(documents, dtype=np.int32)
        rng.shuffle(last)
        document_index = np.concatenate((first, last))
    else:
        document_index = np.array(documents * epochs, dtype=np.int32)
        rng.shuffle(document_index)
    rows = spec_walk(lengths, document_index.tolist(), seq, extra)
    wide = max(len(document_index), max(lengths)) > INT32_MAX
    sample_index = np.array(rows, dtype=np.int64 if wide else np.int32)
    count = len(rows) - 1
    shuffle_type = np.int64 if count >= 2**32 - 2 else np.uint32
    if separate:
        head, tail = np.arange(before, dtype=shuffle_type), np.arange(before, count, dtype=shuffle_type)
        rng.shuffle(head)
        rng.shuffle(tail)
        shuffle_index = np.concatenate((head, tail))
    else:
        shuffle_index = np.arange(count, dtype=shuffle_type)
        rng.shuffle(shuffle_index)
    return document_index, sample_index, shuffle_index


@st.composite
def splits(draw: st.DrawFn) -> dict:
    lengths = draw(st.lists(st.integers(0, 25), min_size=1, max_size=30))
    start = draw(st.integers(0, len(lengths) - 1))
    stop = draw(st.integers(start + 1, len(lengths)))
    extra = draw(st.sampled_from([1, 0]))
    assume(sum(lengths[start:stop]) > extra)
    return {
        "lengths": lengths,
        "documents": list(range(start, stop)),
        "num_samples": None if (count := draw(st.integers(-1, 200))) < 0 else count,  # None: one epoch
        "seq": draw(st.integers(2, 17)),
        "seed": draw(st.one_of(st.integers(0, 2**32 - 1), st.sampled_from([0, 1234, 2**32 - 1]))),
        "extra": extra,
    }


@settings(max_examples=300, deadline=None)
@given(splits())
def test_indices_are_the_spec_construction(case):
    lengths = np.array(case["lengths"], dtype=np.int32)
    got = build_gpt_indices(
        lengths, range(case["documents"][0], case["documents"][-1] + 1), case["num_samples"], case["seq"],
        case["seed"], bool(case["extra"]),
    )  # fmt: skip
    expected = spec_indices(
        case["lengths"], case["documents"], case["num_samples"], case["seq"], case["seed"], case["extra"]
    )
    for name, a, b in zip(("document_index", "sample_index", "shuffle_index"), got, expected, strict=True):
        assert a.dtype == b.dtype, name
        assert a.tolist() == b.tolist(), name
    if case["num_samples"] is not None:
        assert len(got[2]) >= case["num_samples"], "whole epochs, at least the samples asked for"


@settings(max_examples=100, deadline=None)
@given(splits())
def test_items_are_the_tokens_the_walk_names(case):
    """Item i: sample j = shuffle[i], from (document at row j, offset) to (document at row j + 1,
    offset + extra) of the shuffled documents, padded to seq + extra."""
    documents = [[1000 * d + t for t in range(length)] for d, length in enumerate(case["lengths"])]
    source = InMemorySequences(documents)
    dataset = GPTDataset(
        source, np.array(case["documents"]), case["num_samples"], case["seq"], case["seed"], "train",
        add_extra_token_to_sequence=bool(case["extra"]), use_cache=False,
    )  # fmt: skip
    document_index, sample_index, shuffle_index = spec_indices(
        case["lengths"], case["documents"], case["num_samples"], case["seq"], case["seed"], case["extra"]
    )
    for i in range(len(dataset)):
        j = int(shuffle_index[i])
        (first, start), (last, end) = sample_index[j].tolist(), sample_index[j + 1].tolist()
        tokens: list[int] = []
        for position in range(first, last + 1):
            document = documents[document_index[position]]
            stop = end + case["extra"] if position == last else len(document)
            tokens += document[start if position == first else 0 : stop]
        tokens += [-1] * (case["seq"] + case["extra"] - len(tokens))
        assert dataset[i].tolist() == tokens, i
