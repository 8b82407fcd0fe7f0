"""The Megatron .bin/.idx format: reading hand-built files, writing the same bytes, rejecting bad ones."""

from __future__ import annotations

import errno
import io
import struct
from pathlib import Path

import numpy as np
import pytest

from gptrain.data import finalize, indexed
from gptrain.data.indexed import (
    DTYPE_CODES,
    IndexedDataset,
    IndexedDatasetWriter,
    code_for_dtype,
    optimal_dtype,
)
from gptrain.errors import DataError
from gptrain.utils.signals import Terminated

# Three documents: [5, 6, 7], an empty one, and one split into two sequences [1] + [2, 3].
DOCS = [([5, 6, 7], [3]), ([], []), ([1, 2, 3], [1, 2])]


def megatron_bytes(docs, dtype_code: int, token_format: str) -> tuple[bytes, bytes]:
    """The .idx/.bin bytes written straight from the byte layout (not from our writer)."""
    lengths, doc_indices, tokens = [], [0], []
    for doc_tokens, seq_lengths in docs:
        tokens.extend(doc_tokens)
        lengths.extend(seq_lengths)
        doc_indices.append(len(lengths))
    itemsize = struct.calcsize(token_format)
    pointers, position = [], 0
    for length in lengths:
        pointers.append(position)
        position += length * itemsize
    idx = b"MMIDIDX\x00\x00" + struct.pack("<Q", 1) + struct.pack("<B", dtype_code)
    idx += struct.pack("<Q", len(lengths)) + struct.pack("<Q", len(doc_indices))
    idx += struct.pack(f"<{len(lengths)}i", *lengths) + struct.pack(f"<{len(pointers)}q", *pointers)
    idx += struct.pack(f"<{len(doc_indices)}q", *doc_indices)
    return idx, struct.pack(f"<{len(tokens)}{token_format}", *tokens)


def write_pair(prefix: Path, idx: bytes, bin_: bytes) -> str:
    prefix.with_suffix(".idx").write_bytes(idx)
    prefix.with_suffix(".bin").write_bytes(bin_)
    return str(prefix)


def read_pair_bytes(prefix: Path) -> tuple[bytes, bytes]:
    return prefix.with_suffix(".idx").read_bytes(), prefix.with_suffix(".bin").read_bytes()


def test_reads_megatron_file(tmp_path):
    prefix = write_pair(tmp_path / "m", *megatron_bytes(DOCS, 8, "H"))
    ds = IndexedDataset(prefix)
    assert ds.dtype == np.uint16 and len(ds) == 3 and ds.num_documents == 3
    assert ds.sequence_lengths.tolist() == [3, 1, 2] and ds.sequence_lengths.dtype == np.int32
    assert ds.sequence_pointers.tolist() == [0, 6, 8] and ds.sequence_pointers.dtype == np.int64
    assert ds.document_indices.tolist() == [0, 1, 1, 3]
    assert ds.get(0).tolist() == [5, 6, 7]
    assert ds.get(0, offset=1).tolist() == [6, 7]
    assert ds.get(0, offset=1, length=1).tolist() == [6]
    assert ds[2].tolist() == [2, 3] and ds[-1].tolist() == [2, 3]
    assert [a.tolist() for a in ds[0:2]] == [[5, 6, 7], [1]]
    assert IndexedDataset.exists(prefix) and not IndexedDataset.exists(str(tmp_path / "nope"))
    with pytest.raises(IndexError):
        ds.get(3)
    with pytest.raises(IndexError):
        ds.get(0, offset=2, length=2)


def test_pickles_by_path(tmp_path):
    import pickle

    prefix = write_pair(tmp_path / "m", *megatron_bytes(DOCS, 8, "H"))
    data = pickle.dumps(IndexedDataset(prefix))
    assert len(data) < 200 + len(prefix)
    copy = pickle.loads(data)
    assert copy.get(2).tolist() == [2, 3] and copy.document_indices.tolist() == [0, 1, 1, 3]


def test_reads_int32_tokens_and_size_formula(tmp_path):
    idx, bin_ = megatron_bytes(DOCS, 4, "i")
    assert len(idx) == 34 + 12 * 3 + 8 * 4
    ds = IndexedDataset(write_pair(tmp_path / "m", idx, bin_))
    assert ds.dtype == np.int32 and ds.sequence_pointers.tolist() == [0, 12, 16]


@pytest.mark.parametrize(("dtype", "code", "fmt"), [(np.uint16, 8, "H"), (np.int32, 4, "i")])
def test_writer_matches_byte_layout(tmp_path, dtype, code, fmt):
    with IndexedDatasetWriter(str(tmp_path / "w"), dtype) as writer:
        for tokens, lengths in DOCS:
            writer.add_document(np.array(tokens, dtype=np.int64), lengths)
    idx, bin_ = megatron_bytes(DOCS, code, fmt)
    assert (tmp_path / "w.idx").read_bytes() == idx
    assert (tmp_path / "w.bin").read_bytes() == bin_
    assert sorted(p.name for p in tmp_path.iterdir()) == ["w.bin", "w.idx"]  # no temp files left


def test_add_documents_batch_and_chunked_index(tmp_path, monkeypatch):
    """The batch path and the chunked .idx build (chunk of 2 entries) give the same bytes."""
    monkeypatch.setattr(indexed, "_CHUNK", 2)
    docs = [([4, 4], [2]), ([], []), ([9], [1]), ([1, 2, 3, 4], [4]), ([], []), ([7, 8, 9], [3])]
    with IndexedDatasetWriter(str(tmp_path / "w"), np.uint16) as writer:
        writer.add_documents(np.array([4, 4, 9]), np.array([2, 0, 1]))
        writer.add_documents(np.array([1, 2, 3, 4, 7, 8, 9]), np.array([4, 0, 3]))
    written = ((tmp_path / "w.idx").read_bytes(), (tmp_path / "w.bin").read_bytes())
    assert written == megatron_bytes(docs, 8, "H")


def test_add_documents_of_sentences(tmp_path):
    """Texts grouped into documents (a JSON array's sentences): a zero-length text is no sequence;
    a document of no texts, or of empty ones, is an empty document. Returns sequences per document."""
    docs = [([4, 4, 9], [2, 1]), ([], []), ([], []), ([5], [1]), ([1, 2, 3], [3]), ([7, 8], [1, 1])]
    with IndexedDatasetWriter(str(tmp_path / "w"), np.uint16) as writer:
        added = writer.add_documents(
            np.array([4, 4, 9, 5]), np.array([2, 0, 1, 0, 0, 1]), np.array([3, 0, 2, 1])
        )
        assert added.tolist() == [2, 0, 0, 1]
        added = writer.add_documents(np.array([1, 2, 3, 7, 8]), np.array([3, 1, 0, 1]), np.array([1, 3]))
        assert added.tolist() == [1, 2]
    written = ((tmp_path / "w.idx").read_bytes(), (tmp_path / "w.bin").read_bytes())
    assert written == megatron_bytes(docs, 8, "H")
    bad = IndexedDatasetWriter(str(tmp_path / "bad"), np.uint16)
    with pytest.raises(ValueError, match="sentences per document sum to 3, got 2 texts"):
        bad.add_documents(np.array([1]), np.array([1, 0]), np.array([1, 2]))
    bad.abort()


@pytest.mark.parametrize("sentences", [False, True])
def test_a_text_past_the_int32_length_is_refused_naming_its_document(tmp_path, sentences):
    """The .idx holds int32 sequence lengths: 2**31 tokens were written as -2**31, and only verify()
    at the end said the output was corrupt. A zero-stride view: 2**31 tokens without the memory."""
    huge = 2**31
    with IndexedDatasetWriter(str(tmp_path / "w"), np.uint8) as writer:
        writer.add_documents(np.array([1, 2], np.uint8), np.array([2]))  # document 0
        tokens = np.broadcast_to(np.uint8(7), (3 + huge,))
        with pytest.raises(DataError, match="document 2 \\(from 0\\) has a text of 2,147,483,648 tokens"):
            if sentences:  # documents 1 and 2 of two texts each; the long one is document 2's first
                writer.add_documents(tokens, np.array([1, 1, huge, 1]), np.array([2, 2]))
            else:  # documents 1, 2, 3
                writer.add_documents(tokens, np.array([2, huge, 1]))
        with pytest.raises(DataError, match="document 1 \\(from 0\\) has a text of 2,147,483,648"):
            writer.add_document(np.broadcast_to(np.uint8(7), (huge + 1,)), [1, huge])
        writer.add_document(np.array([3], np.uint8))
    assert IndexedDataset(str(tmp_path / "w")).document_indices.tolist() == [0, 1, 2]


def test_empty_dataset(tmp_path):
    IndexedDatasetWriter(str(tmp_path / "e"), np.uint16).finalize()
    assert (tmp_path / "e.idx").stat().st_size == 34 + 8
    ds = IndexedDataset(str(tmp_path / "e"))
    assert len(ds) == 0 and ds.num_documents == 0 and ds.document_indices.tolist() == [0]


def test_a_file_the_file_system_will_not_read_is_a_one_line_error_naming_it(tmp_path, monkeypatch):
    """EIO from a failing disk or EACCES from a shared file system's permissions: named, no traceback."""
    import errno

    with IndexedDatasetWriter(str(tmp_path / "d"), np.uint16) as writer:
        writer.add_document(np.array([1, 2, 3]))

    def refuse(path, **kwargs):
        raise OSError(errno.EIO, "Input/output error", str(path))

    monkeypatch.setattr(indexed.np, "memmap", refuse)
    with pytest.raises(DataError, match=r"d\.idx: cannot be read \(Input/output error\)") as caught:
        IndexedDataset(str(tmp_path / "d"))
    assert "\n" not in str(caught.value)


def test_exception_leaves_nothing(tmp_path):
    with pytest.raises(RuntimeError), IndexedDatasetWriter(str(tmp_path / "w"), np.uint16) as writer:
        writer.add_document(np.array([1, 2, 3]))
        raise RuntimeError("interrupted")
    assert list(tmp_path.iterdir()) == []


def test_finalize_replaces_old_pair(tmp_path):
    prefix = write_pair(tmp_path / "w", *megatron_bytes(DOCS, 8, "H"))
    with IndexedDatasetWriter(prefix, np.uint16) as writer:
        writer.add_document(np.array([42]))
    assert IndexedDataset(prefix).get(0).tolist() == [42]


@pytest.mark.parametrize("move", range(4))  # the .bin of a, of b, the .idx of a, of b
@pytest.mark.parametrize("lands", ["before", "after"])  # the rename it interrupts
@pytest.mark.parametrize("signal", [KeyboardInterrupt, lambda: Terminated(15)])
def test_an_interruption_while_renaming_leaves_the_new_outputs(tmp_path, monkeypatch, move, lands, signal):
    """A SIGTERM (a time limit) or Ctrl-C landing among the renames that replace two old datasets
    (prepare's --json-keys): the cleanup removed the new files after the old indices were gone, so
    neither dataset was left. The renames now finish first; each output is its new dataset."""
    old_idx, old_bin = megatron_bytes(DOCS, 8, "H")
    prefixes = [write_pair(tmp_path / name, old_idx, old_bin) for name in ("a", "b")]
    writers = [IndexedDatasetWriter(prefix, np.uint16) for prefix in prefixes]
    for writer, tokens in zip(writers, ([42], [7, 8]), strict=True):
        writer.add_document(np.array(tokens))
    original, calls = finalize._move_into_place, []

    def interrupted(temp, path):
        calls.append(path)
        if len(calls) == move + 1 and lands == "before":
            raise signal()
        original(temp, path)
        if len(calls) == move + 1:
            raise signal()

    monkeypatch.setattr(finalize, "_move_into_place", interrupted)
    with pytest.raises((KeyboardInterrupt, Terminated)):
        finalize.finalize_together(writers)
    for writer in writers:
        writer.abort()  # what leaving the `with` blocks does
    assert [[s.tolist() for s in IndexedDataset(prefix)[:]] for prefix in prefixes] == [[[42]], [[7, 8]]]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.bin", "a.idx", "b.bin", "b.idx"]


def test_an_old_index_that_cannot_be_removed_leaves_the_old_outputs(tmp_path, monkeypatch):
    """The first rename step failing (nothing changed yet) still removes the new files."""
    old = write_pair(tmp_path / "a", *megatron_bytes(DOCS, 8, "H"))
    writer = IndexedDatasetWriter(old, np.uint16)
    writer.add_document(np.array([42]))
    unlink = Path.unlink

    def refused(self, missing_ok=False):
        if self.name == "a.idx":
            raise PermissionError(13, "Permission denied", str(self))
        unlink(self, missing_ok=missing_ok)

    monkeypatch.setattr(Path, "unlink", refused)
    with pytest.raises(PermissionError):
        finalize.finalize_together([writer])
    monkeypatch.undo()
    assert read_pair_bytes(tmp_path / "a") == megatron_bytes(DOCS, 8, "H")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.bin", "a.idx"]


def test_an_old_index_that_cannot_be_removed_after_another_keeps_its_old_pair(tmp_path, monkeypatch):
    """Past the first step the moves finish where they can: a's new pair goes in (its old index is
    gone), b, whose old index could not be removed, keeps its old pair; no temporary is left."""
    old = megatron_bytes(DOCS, 8, "H")
    writers = [IndexedDatasetWriter(write_pair(tmp_path / name, *old), np.uint16) for name in ("a", "b")]
    for writer in writers:
        writer.add_document(np.array([42]))
    unlink = Path.unlink

    def refused(self, missing_ok=False):
        if self.name == "b.idx":
            raise PermissionError(13, "Permission denied", str(self))
        unlink(self, missing_ok=missing_ok)

    monkeypatch.setattr(Path, "unlink", refused)
    with pytest.raises(PermissionError):
        finalize.finalize_together(writers)
    monkeypatch.undo()
    assert [s.tolist() for s in IndexedDataset(str(tmp_path / "a"))[:]] == [[42]]
    assert read_pair_bytes(tmp_path / "b") == old
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.bin", "a.idx", "b.bin", "b.idx"]


def test_add_index_equals_writing_in_order(tmp_path):
    a = write_pair(tmp_path / "a", *megatron_bytes(DOCS[:2], 8, "H"))
    b = write_pair(tmp_path / "b", *megatron_bytes(DOCS[2:] + DOCS[:1], 8, "H"))
    with IndexedDatasetWriter(str(tmp_path / "ab"), np.uint16) as writer:
        writer.add_index(a)
        writer.add_index(b)
    idx, bin_ = megatron_bytes(DOCS + DOCS[:1], 8, "H")
    assert (tmp_path / "ab.idx").read_bytes() == idx and (tmp_path / "ab.bin").read_bytes() == bin_


def test_add_index_rejects_other_dtype(tmp_path):
    other = write_pair(tmp_path / "o", *megatron_bytes(DOCS, 4, "i"))
    with (
        pytest.raises(DataError, match="o.idx.*int32"),
        IndexedDatasetWriter(str(tmp_path / "w"), np.uint16) as w,
    ):
        w.add_index(other)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["o.bin", "o.idx"]


# Byte offsets of the arrays in the .idx of DOCS (3 sequences, 4 document indices).
LENGTHS, POINTERS, DOC_INDICES = 34, 34 + 4 * 3, 34 + 12 * 3


def corrupt(idx: bytes, offset: int, value: bytes) -> bytes:
    return idx[:offset] + value + idx[offset + len(value) :]


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda i, b: (i[:20], b), "truncated"),
        (lambda i, b: (i[:-8], b), "size .* expected"),
        (lambda i, b: (i + b"\x00\x00\x00", b), "multimodal"),
        (lambda i, b: (corrupt(i, 0, b"XXIDIDX"), b), "bad magic"),
        (lambda i, b: (corrupt(i, 0, b"TNTIDX\x00\x00"), b), "old lazy/cached index .* gptrain data prepare"),
        (lambda i, b: (corrupt(i, 9, struct.pack("<Q", 2)), b), "version 2"),
        (lambda i, b: (corrupt(i, 17, b"\x09"), b), "dtype code 9"),
        (lambda i, b: (i, b[:-2]), r"\.bin: size 10 bytes, expected 12 .*: cut short, or beside a damaged"),
        (lambda i, b: (i, b + b), r"\.bin: size 24 bytes, expected 12 .*: the \.bin of another dataset"),
        (lambda i, b: (corrupt(i, len(i) - 8, struct.pack("<q", 2)), b), "document indices"),
        (
            lambda i, b: (corrupt(i, POINTERS, struct.pack("<q", 2)), b),
            "sequence 0 starts at byte 2, expected 0",
        ),
        (
            lambda i, b: (corrupt(i, POINTERS + 16, struct.pack("<q", 100)), b),
            r"\.bin: size 12 bytes, expected 104",
        ),
    ],
)
def test_rejects_broken_files(tmp_path, mutate, message):
    """Each says what to do too (the header's refusals and a .bin of the wrong size did not)."""
    prefix = write_pair(tmp_path / "m", *mutate(*megatron_bytes(DOCS, 8, "H")))
    with pytest.raises(DataError, match=message) as error:
        IndexedDataset(prefix)
    if message != "multimodal":  # not supported: nothing to do about it
        assert "gptrain data prepare" in str(error.value)


@pytest.mark.parametrize(
    ("offset", "value", "message"),
    [
        (POINTERS + 8, struct.pack("<q", 0), "sequence 1 starts at byte 0, expected 6 "),  # seq 0's tokens
        (LENGTHS + 4, struct.pack("<i", -1), "sequence 1 has length -1"),
        (DOC_INDICES + 16, struct.pack("<q", 0), r"document index entry 2 is 0, less than entry 1 \(1\)"),
    ],
    ids=["pointer-into-sequence-0", "negative-length", "decreasing-document-index"],
)
def test_verify_names_the_first_bad_entry(tmp_path, offset, value, message):
    """Corruption the O(1) checks on open cannot see is found by the full verify()."""
    idx, bin_ = megatron_bytes(DOCS, 8, "H")
    ds = IndexedDataset(write_pair(tmp_path / "m", corrupt(idx, offset, value), bin_))
    with pytest.raises(DataError, match=r"m\.idx: " + message + ".*corrupt: re-create it"):
        ds.verify()


def test_verify_in_chunks(tmp_path, monkeypatch):
    """Chunk boundaries carry the byte offset and the previous document index over."""
    monkeypatch.setattr(indexed, "_VERIFY_CHUNK", 2)
    docs = [([n] * (n % 3), [n % 3] if n % 3 else []) for n in range(9)]
    idx, bin_ = megatron_bytes(docs, 8, "H")
    IndexedDataset(write_pair(tmp_path / "good", idx, bin_)).verify()
    pointers, doc_indices = 34 + 4 * 6, 34 + 12 * 6  # 6 sequences, 10 document indices
    bad_pointer = corrupt(idx, pointers + 8 * 4, struct.pack("<q", 8))  # lengths 1,2,1,2,1,2: it starts at 12
    with pytest.raises(DataError, match="sequence 4 starts at byte 8, expected 12 "):
        IndexedDataset(write_pair(tmp_path / "p", bad_pointer, bin_)).verify()
    bad_doc = corrupt(idx, doc_indices + 8 * 4, struct.pack("<q", 1))  # [0, 0, 1, 2, 1, 3, ...]
    with pytest.raises(DataError, match=r"document index entry 4 is 1, less than entry 3 \(2\)"):
        IndexedDataset(write_pair(tmp_path / "d", bad_doc, bin_)).verify()


@pytest.mark.parametrize(
    ("offset", "value"),
    [
        (POINTERS + 8, struct.pack("<q", 1000)),
        (POINTERS + 8, struct.pack("<q", -4)),
        (LENGTHS + 4, struct.pack("<i", -1)),
    ],
    ids=["pointer-past-the-bin", "negative-pointer", "negative-length"],
)
def test_get_of_a_corrupt_entry_is_a_data_error(tmp_path, offset, value):
    idx, bin_ = megatron_bytes(DOCS, 8, "H")
    ds = IndexedDataset(write_pair(tmp_path / "m", corrupt(idx, offset, value), bin_))
    assert ds.get(0).tolist() == [5, 6, 7]
    with pytest.raises(
        DataError, match=r"m\.idx: sequence 1 \(byte -?\d+, -?\d+ tokens\) lies outside .*m\.bin"
    ):
        ds.get(1)


def test_missing_file(tmp_path):
    (tmp_path / "m.idx").write_bytes(megatron_bytes(DOCS, 8, "H")[0])
    with pytest.raises(DataError, match=r"m\.bin not found beside .*m\.idx \(a copy not finished"):
        IndexedDataset(str(tmp_path / "m"))
    (tmp_path / "m.bin").mkdir()  # was 'no such file' too
    with pytest.raises(
        DataError, match=r"m\.bin: is a directory, not a Megatron \.bin file; pass the prefix of a"
    ):
        IndexedDataset(str(tmp_path / "m"))


def test_dtype_rules():
    assert optimal_dtype(50257) == np.uint16
    assert optimal_dtype(65499) == np.uint16
    assert optimal_dtype(65500) == np.int32
    assert optimal_dtype(200019) == np.int32
    assert all(code_for_dtype(dtype) == code for code, dtype in DTYPE_CODES.items())
    assert code_for_dtype(np.uint16) == 8 and code_for_dtype(np.int32) == 4
    with pytest.raises(DataError):
        code_for_dtype(np.uint32)


def test_a_killed_writers_temporaries_are_removed_by_the_next_write_of_that_output(tmp_path, capsys):
    """SIGKILL (an OOM kill, KillWait past a Slurm time limit) runs no cleanup: a data prepare or
    merge left its hidden `.out.bin.*.tmp` files, as large as the output itself, and no later run
    of the same command ever removed them. Old ones are removed now; ones written in the last hour
    may be a live writer's (another job on the same output) and are only named."""
    import os
    import time

    prefix = tmp_path / "out_text_document"
    dead = [tmp_path / f".out_text_document.bin.dead{n}abc.tmp" for n in range(2)]  # mkstemp's 8 characters
    for path in dead:
        path.write_bytes(b"x" * 1000)
        os.utime(path, (time.time() - 2 * 3600, time.time() - 2 * 3600))
    recent = tmp_path / ".out_text_document.bin.recent12.tmp"
    recent.write_bytes(b"y" * 500)
    others = [  # other outputs': not this writer's to touch, a name that begins with this one's included
        tmp_path / ".other_text_document.bin.deadbeef.tmp",
        tmp_path / ".out_text_document.bin.v2.bin.deadbeef.tmp",
    ]
    for other in others:
        other.write_bytes(b"z")
        os.utime(other, (time.time() - 2 * 3600, time.time() - 2 * 3600))
    with IndexedDatasetWriter(str(prefix), np.uint16) as writer:
        writer.add_document(np.arange(5, dtype=np.int64))
    assert not any(path.exists() for path in dead) and recent.exists() and all(p.exists() for p in others)
    assert sorted(p.name for p in tmp_path.iterdir() if not p.name.startswith(".")) == [
        "out_text_document.bin",
        "out_text_document.idx",
    ]
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2, err
    assert f"removed 2 temporary files (2.0 kB) beside {prefix}.bin" in err[0]
    assert "1 temporary file (0.5 kB)" in err[1] and str(recent.parent) in err[1] and "delete" in err[1]


@pytest.mark.parametrize("nfs", [False, True], ids=["local", "nfs"])
def test_a_live_writers_temporaries_are_kept_however_old(tmp_path, capsys, nfs, request):
    """The cleanup above judged a temporary by its age alone: a live writer's `.idx` temporary
    (created at its start, written at its end) is as old as the run, and its `.bin` one goes
    untouched while the job is suspended; a second write of the output deleted them, and the first
    one's finish then removed the old `.idx` and failed, leaving the earlier dataset without its
    index. A live writer holds its temporaries (flock): kept at any age, and the old outputs stay.
    On NFS too, where the `.idx` one, held open read-only, could not be locked exclusively."""
    import os
    import time

    if nfs:
        request.getfixturevalue("flock_as_nfs")

    prefix = tmp_path / "out_text_document"
    with IndexedDatasetWriter(str(prefix), np.uint16) as old:
        old.add_document(np.arange(3, dtype=np.int64))
    before = (
        (tmp_path / "out_text_document.bin").read_bytes(),
        (tmp_path / "out_text_document.idx").read_bytes(),
    )
    first = IndexedDatasetWriter(str(prefix), np.uint16)
    first.add_document(np.arange(7, dtype=np.int64))
    hours_ago = time.time() - 5 * 3600
    for temp in first._temps:
        os.utime(temp, (hours_ago, hours_ago))
    second = IndexedDatasetWriter(str(prefix), np.uint16)  # another job on the same output
    assert all(temp.exists() for temp in first._temps)
    assert "removed" not in capsys.readouterr().err
    second.abort()
    first.finalize()
    assert IndexedDataset(str(prefix)).get(0).tolist() == list(range(7))
    assert before != (
        (tmp_path / "out_text_document.bin").read_bytes(),
        (tmp_path / "out_text_document.idx").read_bytes(),
    )


@pytest.mark.parametrize(("code", "fmt"), [(7, "f"), (6, "d")], ids=["float32", "float64"])
def test_float_tokens_read_as_megatron_reads_them(tmp_path, code, fmt):
    """Megatron's dtype table has float64 (6) and float32 (7); its GPTDataset turns the sample into
    ids with torch's .long(), which truncates toward zero. The samples here are those of a dataset
    of the truncated ids, and inspect shows the stored values as they are."""
    from gptrain.data.gpt_dataset import GPTDataset
    from gptrain.data.summary import summarize

    floats = [([5.75, 6.0, 7.5], [3]), ([], []), ([1.0, 2.25, 3.0, 0.5, 9.75], [1, 4])]
    truncated = [([int(t) for t in tokens], lengths) for tokens, lengths in floats]
    as_floats = IndexedDataset(write_pair(tmp_path / "f", *megatron_bytes(floats, code, fmt)))
    as_ints = IndexedDataset(write_pair(tmp_path / "i", *megatron_bytes(truncated, 8, "H")))
    assert as_floats.dtype == DTYPE_CODES[code] and as_floats.get(2).tolist() == [2.25, 3.0, 0.5, 9.75]
    samples = [
        GPTDataset(source, range(3), 7, 2, 1234, "train", use_cache=False) for source in (as_floats, as_ints)
    ]
    assert len(samples[0]) == len(samples[1]) == 7  # two epochs of 8 tokens
    for k in range(7):
        assert samples[0][k].dtype == np.int64 and samples[0][k].tolist() == samples[1][k].tolist()
    assert summarize(str(tmp_path / "f"), document=2)["document"]["ids"][:2] == [1.0, 2.25]


class _FullDisk(io.RawIOBase):
    """A file on a disk that has just filled up: every write fails with ENOSPC."""

    def __init__(self, raw: io.RawIOBase) -> None:
        self._raw = raw

    def writable(self) -> bool:
        return True

    def write(self, data) -> int:
        raise OSError(errno.ENOSPC, "No space left on device")

    def close(self) -> None:
        self._raw.close()
        super().close()


def test_a_full_disk_leaves_no_temporary_behind_even_with_tokens_still_buffered(tmp_path):
    """The write that fills the disk ends the `with` block; abort's close flushes the tokens
    still buffered, which fails on the same full disk, and that used to escape before any temporary
    was removed: `data prepare` and `data merge` then left one as large as all tokens so far."""
    writer = IndexedDatasetWriter(str(tmp_path / "out"), np.uint16)
    with pytest.raises(OSError, match="No space"), writer:
        writer._bin = io.BufferedWriter(_FullDisk(writer._bin.detach()))
        writer.add_document(np.arange(1000))  # 2,000 bytes: held in the 8 KiB buffer
        writer._bin.flush()  # the disk is full
    assert list(tmp_path.iterdir()) == []
