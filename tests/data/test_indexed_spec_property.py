"""The .bin/.idx pair against the byte layout of the spec (megatron-data-format.md, sections 1-2),
both ways: what gptrain writes, read by a reader written here from the spec alone, and what a
writer written here from the spec writes, read by gptrain; drawn by hypothesis over the integer
dtype codes, empty documents, documents of several (also zero-length) sequences, and counts past
the writer's and verify's chunks."""

from __future__ import annotations

import struct
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gptrain.data import indexed
from gptrain.data.indexed import IndexedDataset, IndexedDatasetWriter

# The spec's dtype codes of integer tokens, with their struct format (no gptrain table).
TOKEN_FORMATS = {1: "B", 2: "b", 3: "h", 4: "i", 5: "q", 8: "H"}
NUMPY_TYPES = {1: "<u1", 2: "<i1", 3: "<i2", 4: "<i4", 5: "<i8", 8: "<u2"}

Document = list[list[int]]  # its sequences, each a list of token ids


@dataclass
class SpecPair:
    """A dataset as the spec describes it, read from or to be written as raw bytes."""

    code: int
    lengths: list[int]
    pointers: list[int]
    document_indices: list[int]
    sequences: list[list[int]]


def spec_from_documents(code: int, documents: list[Document]) -> SpecPair:
    itemsize = struct.calcsize("<" + TOKEN_FORMATS[code])
    lengths, pointers, doc_indices, sequences, position = [], [], [0], [], 0
    for document in documents:
        for sequence in document:
            lengths.append(len(sequence))
            pointers.append(position)
            sequences.append(list(sequence))
            position += len(sequence) * itemsize
        doc_indices.append(len(lengths))
    return SpecPair(code, lengths, pointers, doc_indices, sequences)


def spec_write(prefix: Path, pair: SpecPair) -> None:
    """The spec's writer: header, int32 lengths, int64 pointers, int64 document indices; raw tokens."""
    s, d = len(pair.lengths), len(pair.document_indices)
    idx = b"MMIDIDX\x00\x00" + struct.pack("<Q", 1) + struct.pack("<B", pair.code)
    idx += struct.pack("<Q", s) + struct.pack("<Q", d)
    idx += np.asarray(pair.lengths, dtype="<i4").tobytes()
    idx += np.asarray(pair.pointers, dtype="<i8").tobytes()
    idx += np.asarray(pair.document_indices, dtype="<i8").tobytes()
    tokens = [t for sequence in pair.sequences for t in sequence]
    Path(f"{prefix}.idx").write_bytes(idx)
    Path(f"{prefix}.bin").write_bytes(np.asarray(tokens, dtype=NUMPY_TYPES[pair.code]).tobytes())


def spec_read(prefix: Path) -> SpecPair:
    """The spec's reader, checking what the spec fixes: magic, version, sizes, pointer rule."""
    idx = Path(f"{prefix}.idx").read_bytes()
    data = Path(f"{prefix}.bin").read_bytes()
    assert idx[:9] == b"MMIDIDX\x00\x00"
    (version,) = struct.unpack_from("<Q", idx, 9)
    (code,) = struct.unpack_from("<B", idx, 17)
    s, d = struct.unpack_from("<QQ", idx, 18)
    assert version == 1 and code in TOKEN_FORMATS
    assert len(idx) == 34 + 12 * s + 8 * d, "file size = 34 + 12 S + 8 D"
    lengths = np.frombuffer(idx, "<i4", s, 34).tolist()
    pointers = np.frombuffer(idx, "<i8", s, 34 + 4 * s).tolist()
    document_indices = np.frombuffer(idx, "<i8", d, 34 + 12 * s).tolist()
    itemsize = np.dtype(NUMPY_TYPES[code]).itemsize
    assert len(data) == sum(lengths) * itemsize, ".bin size = total tokens x itemsize"
    sequences = [
        np.frombuffer(data, NUMPY_TYPES[code], length, pointer).tolist()
        for length, pointer in zip(lengths, pointers, strict=True)
    ]
    return SpecPair(code, lengths, pointers, document_indices, sequences)


def token_ids(code: int) -> st.SearchStrategy[int]:
    info = np.iinfo(np.dtype(NUMPY_TYPES[code]))
    return st.one_of(st.sampled_from([int(info.min), int(info.max), 0]), st.integers(info.min, info.max))


@st.composite
def datasets(draw: st.DrawFn, with_empty_sequences: bool = True) -> tuple[int, list[Document]]:
    """(dtype code, documents): empty documents, and documents of several sequences."""
    code = draw(st.sampled_from(sorted(TOKEN_FORMATS)))
    sequence = st.lists(token_ids(code), min_size=0 if with_empty_sequences else 1, max_size=6)
    documents = draw(st.lists(st.lists(sequence, max_size=4), max_size=12))
    return code, documents


def gptrain_write(prefix: Path, code: int, documents: list[Document]) -> None:
    with IndexedDatasetWriter(str(prefix), NUMPY_TYPES[code]) as writer:
        for document in documents:
            tokens = np.array([t for sequence in document for t in sequence], dtype=np.int64)
            writer.add_document(tokens, [len(sequence) for sequence in document])


def gptrain_read(prefix: Path) -> SpecPair:
    dataset = IndexedDataset(str(prefix))
    dataset.verify()
    code = {np.dtype(t): c for c, t in NUMPY_TYPES.items()}[dataset.dtype]
    assert dataset.num_documents == len(dataset.document_indices) - 1
    assert dataset.num_tokens == int(np.sum(dataset.sequence_lengths, dtype=np.int64))
    return SpecPair(
        code,
        dataset.sequence_lengths.tolist(),
        dataset.sequence_pointers.tolist(),
        dataset.document_indices.tolist(),
        [dataset.get(i).tolist() for i in range(len(dataset))],
    )


PROPERTY = settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


@PROPERTY
@given(datasets())
def test_what_gptrain_writes_is_the_spec_layout(drawn):
    code, documents = drawn
    with tempfile.TemporaryDirectory() as directory:
        prefix = Path(directory, "w")
        gptrain_write(prefix, code, documents)
        assert spec_read(prefix) == spec_from_documents(code, documents)


@PROPERTY
@given(datasets())
def test_what_the_spec_writer_writes_gptrain_reads(drawn):
    code, documents = drawn
    expected = spec_from_documents(code, documents)
    with tempfile.TemporaryDirectory() as directory:
        prefix = Path(directory, "m")
        spec_write(prefix, expected)
        assert gptrain_read(prefix) == expected


@PROPERTY
@given(datasets(with_empty_sequences=False), datasets(with_empty_sequences=False))
def test_a_merge_is_the_spec_layout_of_both_in_order(first, second):
    """add_index (data merge) appends another pair: the documents of both, in order."""
    code, documents = first
    rest = [[[t % 100 for t in sequence] for sequence in document] for document in second[1]]
    with tempfile.TemporaryDirectory() as directory:
        spec_write(Path(directory, "b"), spec_from_documents(code, rest))
        with IndexedDatasetWriter(str(Path(directory, "m")), NUMPY_TYPES[code]) as writer:
            for document in documents:
                tokens = np.array([t for sequence in document for t in sequence], dtype=np.int64)
                writer.add_document(tokens, [len(sequence) for sequence in document])
            writer.add_index(str(Path(directory, "b")))
        assert spec_read(Path(directory, "m")) == spec_from_documents(code, documents + rest)


@PROPERTY
@given(st.sampled_from(sorted(TOKEN_FORMATS)), st.data())
def test_batched_texts_are_preprocess_datas_documents(code, data):
    """add_documents (prepare's path): a document is its non-empty texts, one sequence each; a
    document of none (or only empty texts) is an empty document, still a document-index entry."""
    texts_per_document = data.draw(
        st.lists(st.lists(st.lists(token_ids(code), max_size=5), max_size=3), max_size=10)
    )
    grouped = data.draw(st.booleans())
    if not grouped:  # one text per document, the plain-string case
        texts_per_document = [document[:1] or [[]] for document in texts_per_document]
    documents = [[text for text in document if text] for document in texts_per_document]
    texts = [text for document in texts_per_document for text in document]
    tokens = np.array([t for text in texts for t in text], dtype=np.int64)
    lengths = np.array([len(text) for text in texts], dtype=np.int64)
    sentences = np.array([len(document) for document in texts_per_document]) if grouped else None
    with tempfile.TemporaryDirectory() as directory:
        with IndexedDatasetWriter(str(Path(directory, "w")), NUMPY_TYPES[code]) as writer:
            added = writer.add_documents(tokens, lengths, sentences)
        assert added.tolist() == [len(document) for document in documents]
        assert spec_read(Path(directory, "w")) == spec_from_documents(code, documents)


@pytest.mark.parametrize("code", [8, 4, 5])
def test_counts_past_every_chunk_both_ways(tmp_path, monkeypatch, code):
    """An odd sequence count past the writer's 2**20-entry copy chunk and (made small here) verify's
    chunk, with empty documents and documents of several sequences among them."""
    monkeypatch.setattr(indexed, "_VERIFY_CHUNK", 1000)
    rng = np.random.default_rng(code)
    documents = (1 << 20) + 7
    sequences_per_document = rng.choice([0, 1, 1, 1, 2, 3], size=documents)
    count = int(sequences_per_document.sum())
    lengths = rng.integers(1, 4, size=count)
    tokens = rng.integers(0, 60000, size=int(lengths.sum()))
    with IndexedDatasetWriter(str(tmp_path / "w"), NUMPY_TYPES[code]) as writer:
        writer.add_documents(tokens, lengths, sequences_per_document)
    idx = (tmp_path / "w.idx").read_bytes()
    s, d = struct.unpack_from("<QQ", idx, 18)
    assert (s, d) == (count, documents + 1) and len(idx) == 34 + 12 * s + 8 * d
    assert np.array_equal(np.frombuffer(idx, "<i4", s, 34), lengths)
    itemsize = np.dtype(NUMPY_TYPES[code]).itemsize
    pointers = np.concatenate(([0], np.cumsum(lengths)[:-1])) * itemsize
    assert np.array_equal(np.frombuffer(idx, "<i8", s, 34 + 4 * s), pointers)
    doc_indices = np.concatenate(([0], np.cumsum(sequences_per_document)))
    assert np.array_equal(np.frombuffer(idx, "<i8", d, 34 + 12 * s), doc_indices)
    bin_ = (tmp_path / "w.bin").read_bytes()
    assert np.array_equal(np.frombuffer(bin_, NUMPY_TYPES[code]), tokens)
    # and gptrain reads the same arrays back, verify() crossing its chunks
    dataset = IndexedDataset(str(tmp_path / "w"))
    dataset.verify()
    assert np.array_equal(dataset.document_indices, doc_indices) and len(dataset) == count
    last = count - 1
    assert dataset.get(last).tolist() == tokens[pointers[last] // itemsize :].tolist()


def test_pointers_past_2_gib_are_read_as_int64(tmp_path):
    """A .bin of more than 2**31 bytes (sparse here): the pointers past int32 are read and checked
    as the spec's int64, and the tokens at the far end are reachable."""
    lengths = [2**28, 2**28, 3]  # int64 tokens: sequence 2 starts at byte 2**32
    pair = SpecPair(5, lengths, [0, 2**31, 2**32], [0, 1, 1, 3], [])
    idx = b"MMIDIDX\x00\x00" + struct.pack("<QBQQ", 1, 5, 3, 4)
    idx += np.asarray(pair.lengths, "<i4").tobytes() + np.asarray(pair.pointers, "<i8").tobytes()
    idx += np.asarray(pair.document_indices, "<i8").tobytes()
    (tmp_path / "big.idx").write_bytes(idx)
    with open(tmp_path / "big.bin", "wb") as handle:
        handle.seek(2**32)
        handle.write(np.asarray([7, 8, 9], "<i8").tobytes())
    dataset = IndexedDataset(str(tmp_path / "big"))
    dataset.verify()
    assert dataset.sequence_pointers.tolist() == [0, 2**31, 2**32]
    assert dataset.get(2).tolist() == [7, 8, 9] and dataset.get(1, offset=2**28 - 1).tolist() == [0]
    assert dataset.num_tokens == 2**29 + 3
