"""Megatron-LM's indexed dataset format: `<prefix>.bin` (tokens) + `<prefix>.idx` (index).

The `.idx` layout (little-endian, packed) is the compatibility contract with Megatron:
9-byte magic, u64 version 1, u8 dtype code, u64 sequence count S, u64 document-index
length D (documents + 1), then S int32 lengths, S int64 byte pointers, D int64 document
indices. The writer streams: tokens go straight to the `.bin`, lengths and document
indices are spilled to temporary files, so memory stays flat however large the dataset.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import struct
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import IO

import numpy as np

from gptrain.data.blend_spec import strip_suffix
from gptrain.data.finalize import finalize_together
from gptrain.data.map_limit import OutOfMemoryMaps
from gptrain.data.pair_check import pair_problem
from gptrain.data.write_cleanup import make_directories, remove_if_empty, report_stale_temporaries
from gptrain.errors import DataError, os_error_text
from gptrain.utils.atomic import hold, temporary_sibling
from gptrain.utils.limits import is_out_of_memory_maps, is_too_many_open_files, too_many_open_files

MAGIC = b"MMIDIDX\x00\x00"
# The index of Megatron's lazy and cached formats (--dataset-impl lazy|cached), gone from Megatron in 2023.
LEGACY_MAGIC = b"TNTIDX\x00\x00"
VERSION = 1
MAX_SEQUENCE_LENGTH = 2**31 - 1  # the .idx stores sequence lengths as int32
HEADER = struct.Struct("<9sQBQQ")  # magic, version, dtype code, S, D: 34 bytes, no padding
HEADER_SIZE = HEADER.size

DTYPE_CODES: dict[int, np.dtype] = {
    1: np.dtype(np.uint8),
    2: np.dtype(np.int8),
    3: np.dtype(np.int16),
    4: np.dtype(np.int32),
    5: np.dtype(np.int64),
    6: np.dtype(np.float64),
    7: np.dtype(np.float32),
    8: np.dtype(np.uint16),
}

# Entries moved per step when copying index arrays, so finalize/merge use bounded memory.
_CHUNK = 1 << 20
# Bytes of tokens moved per step when merging.
_COPY_BLOCK = 16 << 20
# Sequences checked per step by IndexedDataset.verify: ~24 bytes each, so ~100 MB of memory.
_VERIFY_CHUNK = 1 << 22
_CORRUPT = "; the index is corrupt: re-create it (gptrain data prepare or merge)"
# A file cut short (a copy or a transfer that did not finish) or another dataset's: often whole elsewhere.
_RECOPY = "; copy the .bin and .idx again, together, or re-create them (gptrain data prepare or merge)"


def code_for_dtype(dtype: np.dtype | type) -> int:
    """The `.idx` dtype code of a numpy token dtype."""
    dtype = np.dtype(dtype)
    for code, known in DTYPE_CODES.items():
        if known == dtype:
            return code
    raise DataError(f"token dtype {dtype} cannot be stored in a Megatron .idx (use uint16 or int32)")


def optimal_dtype(vocab_size: int, entries: int | None = None) -> np.dtype:
    """Megatron's rule: uint16 when the (unpadded) vocab has fewer than 65,500 `entries` (its count,
    preprocess_data's len(tokenizer); `vocab_size`, the highest id + 1, if not told), else int32;
    int32 too where an id is past what uint16 holds (a vocabulary numbered with gaps), which
    Megatron's builder refuses (numpy.array(ids, dtype=uint16): OverflowError with numpy >= 2) or,
    with numpy < 2, writes wrapped, as another token."""
    count = vocab_size if entries is None else entries
    return np.dtype(np.uint16) if count < 65500 and vocab_size <= 65536 else np.dtype(np.int32)


def _map_file(path: Path) -> np.ndarray:
    """Read-only byte view of a file; numpy cannot memory-map an empty file. A file that cannot be
    opened (permissions, an I/O error of the file system) or mapped is a one-line error naming it."""
    try:
        if path.stat().st_size == 0:
            return np.empty(0, dtype=np.uint8)
        return np.memmap(path, mode="r", dtype=np.uint8)
    except OSError as error:
        raise map_error(path, error) from None


def map_error(path: Path, error: OSError) -> DataError:
    """The one line for a failed open or map of `path`: out of descriptors or memory maps is not the
    file's fault (a blend of thousands of shards), anything else is its permissions or file system."""
    if is_too_many_open_files(error):
        return DataError(too_many_open_files(path, error))
    if is_out_of_memory_maps(error):
        return OutOfMemoryMaps.now(path)
    return DataError(
        f"{path}: cannot be read ({error.strerror or error}); check its permissions and file system"
    )


class IndexedDataset:
    """Memory-mapped reader of a Megatron `.bin`/`.idx` pair, validated on open."""

    def __init__(self, path_prefix: str) -> None:
        self.path_prefix = strip_suffix(str(path_prefix))
        self.idx_path = Path(self.path_prefix + ".idx")
        self.bin_path = Path(self.path_prefix + ".bin")
        if (problem := pair_problem(self.path_prefix)) is not None:
            raise DataError(problem)
        self._index = _map_file(self.idx_path)
        code, count, doc_count = self._read_header()
        self._dtype = DTYPE_CODES[code]
        lengths_end = HEADER_SIZE + 4 * count
        pointers_end = lengths_end + 8 * count
        self._lengths = np.frombuffer(self._index, np.int32, count, HEADER_SIZE)
        self._pointers = np.frombuffer(self._index, np.int64, count, lengths_end)
        self._doc_indices = np.frombuffer(self._index, np.int64, doc_count, pointers_end)
        self._bin = _map_file(self.bin_path)
        self._verified = False
        self._validate(count)

    def _read_header(self) -> tuple[int, int, int]:
        size = len(self._index)
        if size < HEADER_SIZE:
            raise DataError(f"{self.idx_path}: truncated ({size} bytes, header needs {HEADER_SIZE}){_RECOPY}")
        magic, version, code, count, doc_count = HEADER.unpack(bytes(self._index[:HEADER_SIZE]))
        if magic.startswith(LEGACY_MAGIC):
            raise DataError(
                f"{self.idx_path}: Megatron's old lazy/cached index (--dataset-impl lazy or cached), which "
                "Megatron stopped reading in 2023; re-create the dataset from its text with gptrain data prepare"
            )
        if magic != MAGIC:
            raise DataError(
                f"{self.idx_path}: not a Megatron index (bad magic {magic!r}); give the prefix of a .bin/.idx "
                "pair written by Megatron's preprocess_data.py or gptrain data prepare"
            )
        if version != VERSION:
            raise DataError(
                f"{self.idx_path}: unsupported index version {version} (Megatron's format has only 1){_CORRUPT}"
            )
        if code not in DTYPE_CODES:
            raise DataError(
                f"{self.idx_path}: unknown token dtype code {code} (Megatron's are 1 to 8){_CORRUPT}"
            )
        expected = HEADER_SIZE + 12 * count + 8 * doc_count
        if size == expected + count and count:
            raise DataError(
                f"{self.idx_path}: a multimodal index (per-sequence modes); only text is supported"
            )
        if size != expected:
            raise DataError(
                f"{self.idx_path}: size {size} bytes, expected {expected} for {count} sequences and "
                f"{doc_count} document indices (truncated, or corrupt){_RECOPY}"
            )
        if doc_count < 1:
            raise DataError(f"{self.idx_path}: empty document index (needs at least the leading 0){_CORRUPT}")
        return code, count, doc_count

    def _validate(self, count: int) -> None:
        """O(1) checks of the ends of the arrays: a DataLoader worker re-opens the files."""
        if self._doc_indices[0] != 0 or self._doc_indices[-1] != count:
            raise DataError(
                f"{self.idx_path}: document indices run from {self._doc_indices[0]} to "
                f"{self._doc_indices[-1]}, expected 0 to the sequence count {count}{_CORRUPT}"
            )
        end = 0
        if count:
            if self._pointers[0] != 0:
                raise DataError(
                    f"{self.idx_path}: sequence 0 starts at byte {self._pointers[0]}, expected 0{_CORRUPT}"
                )
            end = int(self._pointers[-1]) + int(self._lengths[-1]) * self._dtype.itemsize
        if len(self._bin) != end:
            which = "cut short" if len(self._bin) < end else "the .bin of another dataset"
            raise DataError(
                f"{self.bin_path}: size {len(self._bin)} bytes, expected {end} (where the last sequence "
                f"of the .idx ends, in {self._dtype} tokens): {which}, or beside a damaged .idx{_RECOPY}"
            )

    def verify(self) -> None:
        """Check every entry of the index, in bounded memory; a DataError names the first bad one.

        Lengths must be non-negative, each pointer the sum of the byte lengths before it, and
        the document indices non-decreasing (so within [0, count], given the ends checked on
        open). Reads 20 bytes per sequence: run it once per build, not on every open.
        """
        if self._verified:
            return
        itemsize, offset, count = self._dtype.itemsize, 0, len(self._lengths)
        for start in range(0, count, _VERIFY_CHUNK):
            lengths = self._lengths[start : start + _VERIFY_CHUNK]
            negative = np.flatnonzero(lengths < 0)
            if len(negative):
                bad = start + int(negative[0])
                raise DataError(f"{self.idx_path}: sequence {bad} has length {self._lengths[bad]}{_CORRUPT}")
            byte_lengths = lengths.astype(np.int64)
            byte_lengths *= itemsize
            starts = np.cumsum(byte_lengths)
            starts -= byte_lengths
            starts += offset
            offset = int(starts[-1] + byte_lengths[-1])
            del byte_lengths
            wrong = np.flatnonzero(starts != self._pointers[start : start + _VERIFY_CHUNK])
            if len(wrong):
                bad = start + int(wrong[0])
                raise DataError(
                    f"{self.idx_path}: sequence {bad} starts at byte {self._pointers[bad]}, expected "
                    f"{starts[wrong[0]]} (the lengths before it){_CORRUPT}"
                )
        self._verify_documents()
        self._verified = True

    def _verify_documents(self) -> None:
        docs = self._doc_indices
        for start in range(0, len(docs) - 1, _VERIFY_CHUNK):
            window = docs[start : start + _VERIFY_CHUNK + 1]
            falls = np.flatnonzero(window[1:] < window[:-1])
            if len(falls):
                bad = start + int(falls[0]) + 1
                raise DataError(
                    f"{self.idx_path}: document index entry {bad} is {docs[bad]}, less than entry "
                    f"{bad - 1} ({docs[bad - 1]}){_CORRUPT}"
                )

    def __getstate__(self) -> str:
        """Pickle by path: a DataLoader worker re-maps the files instead of copying them."""
        return self.path_prefix

    def __setstate__(self, path_prefix: str) -> None:
        self.__init__(path_prefix)  # type: ignore[misc]

    @staticmethod
    def exists(path_prefix: str) -> bool:
        prefix = strip_suffix(str(path_prefix))
        return os.path.isfile(prefix + ".idx") and os.path.isfile(prefix + ".bin")

    @property
    def dtype(self) -> np.dtype:
        return self._dtype

    @property
    def sequence_lengths(self) -> np.ndarray:
        return self._lengths

    @property
    def sequence_pointers(self) -> np.ndarray:
        return self._pointers

    @property
    def document_indices(self) -> np.ndarray:
        return self._doc_indices

    @property
    def num_documents(self) -> int:
        return len(self._doc_indices) - 1

    @property
    def num_tokens(self) -> int:
        return len(self._bin) // self._dtype.itemsize

    def __len__(self) -> int:
        return len(self._lengths)

    def get(self, idx: int, offset: int = 0, length: int | None = None) -> np.ndarray:
        """Tokens of sequence `idx` from `offset` (a view into the memory-mapped `.bin`)."""
        size = len(self._lengths)
        if idx < 0:
            idx += size
        if not 0 <= idx < size:
            raise IndexError(f"sequence {idx} out of range for {size} sequences")
        available, start = int(self._lengths[idx]), int(self._pointers[idx])
        itemsize = self._dtype.itemsize
        if available < 0 or start < 0 or start + available * itemsize > len(self._bin):
            raise DataError(
                f"{self.idx_path}: sequence {idx} (byte {start}, {available} tokens) lies outside "
                f"{self.bin_path} ({len(self._bin)} bytes){_CORRUPT}"
            )
        if length is None:
            length = available - offset
        if offset < 0 or length < 0 or offset + length > available:
            raise IndexError(
                f"tokens [{offset}, {offset + length}) out of range for a sequence of {available}"
            )
        return np.frombuffer(self._bin, self._dtype, length, start + offset * itemsize)

    def __getitem__(self, idx: int | slice) -> np.ndarray | list[np.ndarray]:
        if isinstance(idx, slice):
            return [self.get(i) for i in range(*idx.indices(len(self)))]
        return self.get(int(idx))


class IndexedDatasetWriter:
    """Streams documents into `<prefix>.bin`/`.idx`; the pair appears only when complete.

    Everything is written under temporary names in the output directory. `finalize()`
    builds the `.idx` from the spilled arrays, then renames the `.bin` first and the
    `.idx` last, so a reader never sees an index without its tokens. Leaving the `with`
    block by an exception removes every temporary file.
    """

    def __init__(self, path_prefix: str, dtype: np.dtype | type) -> None:
        self.path_prefix = strip_suffix(str(path_prefix))
        self.dtype = np.dtype(dtype)
        self._code = code_for_dtype(self.dtype)
        self.bin_path = Path(self.path_prefix + ".bin")
        self.idx_path = Path(self.path_prefix + ".idx")
        self._made_directories: list[Path] = []
        try:
            make_directories(self.bin_path.parent, self._made_directories)
            report_stale_temporaries(self.bin_path)
            self._temps = [temporary_sibling(self.bin_path) for _ in range(4)]
        except OSError as error:
            reason = os_error_text(error, self.bin_path.parent)  # before the path it names is unmade
            remove_if_empty(self._made_directories)
            raise DataError(f"{self.bin_path}: cannot create the output ({reason})") from None
        self._bin: IO[bytes] = open(self._temps[0], "wb")  # noqa: SIM115 (closed in finalize/abort)
        self._lengths: IO[bytes] = open(self._temps[1], "w+b")  # noqa: SIM115
        self._docs: IO[bytes] = open(self._temps[2], "w+b")  # noqa: SIM115
        # the .idx's, written last; open for writing, as `hold`'s lock needs on NFS
        self._index_hold: IO[bytes] = open(self._temps[3], "r+b")  # noqa: SIM115
        for handle in (self._bin, self._lengths, self._docs, self._index_hold):
            hold(handle)  # not stale to another write of this output, however long this one runs
        self._docs.write(np.zeros(1, np.int64).tobytes())
        self.num_sequences = 0
        self.num_documents = 0
        self.num_tokens = 0
        self._done = False

    def add_document(self, tokens: np.ndarray, lengths: list[int] | None = None) -> None:
        """Append one document; `lengths` splits it into sequences, kept as given like Megatron's
        builder (default: one sequence, none for an empty document)."""
        tokens = np.asarray(tokens)
        if lengths is None:
            lengths = [len(tokens)] if len(tokens) else []
        seq_lengths = np.asarray(lengths, dtype=np.int64)
        if int(seq_lengths.sum()) != len(tokens):
            raise ValueError(f"sequence lengths sum to {int(seq_lengths.sum())}, document has {len(tokens)}")
        if len(seq_lengths) and int(seq_lengths.max()) > MAX_SEQUENCE_LENGTH:
            self._refuse_long_text(self.num_documents, int(seq_lengths.max()))
        self._write_tokens(tokens)
        self._lengths.write(seq_lengths.astype(np.int32).tobytes())
        self.num_sequences += len(seq_lengths)
        self.num_documents += 1
        self._docs.write(np.int64(self.num_sequences).tobytes())

    def add_documents(
        self, tokens: np.ndarray, lengths: np.ndarray, sentences: np.ndarray | None = None
    ) -> np.ndarray:
        """Append many documents at once, as preprocess_data.py writes them: `lengths` are per text,
        a document being one text, or `sentences[d]` texts in a row (a JSON array's sentences).
        A zero-length text is no sequence, so a document of none is empty. Returns the number of
        sequences of each document."""
        lengths = np.asarray(lengths, dtype=np.int64)
        if int(lengths.sum()) != len(tokens):
            raise ValueError(f"text lengths sum to {int(lengths.sum())}, got {len(tokens)} tokens")
        if sentences is not None and int(np.sum(sentences)) != len(lengths):
            raise ValueError(
                f"sentences per document sum to {int(np.sum(sentences))}, got {len(lengths)} texts"
            )
        if len(lengths) and int(lengths.max()) > MAX_SEQUENCE_LENGTH:
            text = int(np.argmax(lengths > MAX_SEQUENCE_LENGTH))
            ends = None if sentences is None else np.cumsum(sentences)
            document = text if ends is None else int(np.searchsorted(ends, text, side="right"))
            self._refuse_long_text(self.num_documents + document, int(lengths[text]))
        nonempty = lengths > 0
        self._write_tokens(tokens)
        self._lengths.write(lengths[nonempty].astype(np.int32).tobytes())
        kept = np.cumsum(nonempty, dtype=np.int64)  # sequences up to and including each text
        if sentences is not None:
            kept = np.concatenate(([0], kept))[np.cumsum(sentences, dtype=np.int64)]
        doc_ends = self.num_sequences + kept
        self._docs.write(doc_ends.tobytes())
        per_document = np.diff(doc_ends, prepend=self.num_sequences)
        self.num_sequences += int(kept[-1]) if len(kept) else 0
        self.num_documents += len(kept)
        return per_document

    def _refuse_long_text(self, document: int, length: int) -> None:
        """The .idx records each sequence's length as an int32: a longer one was written wrapped
        (negative), and verify() then called the whole output corrupt."""
        raise DataError(
            f"{self.bin_path}: document {document:,} (from 0) has a text of {length:,} tokens, more than "
            f"the {MAX_SEQUENCE_LENGTH:,} a Megatron .idx records for one sequence (int32 lengths); split "
            "that text into smaller documents"
        )

    def _write_tokens(self, tokens: np.ndarray) -> None:
        if tokens.dtype != self.dtype:
            tokens = tokens.astype(self.dtype)
        self._bin.write(memoryview(np.ascontiguousarray(tokens)).cast("B"))
        self.num_tokens += len(tokens)

    def add_index(self, other_prefix: str, on_copied: Callable[[int], None] | None = None) -> None:
        """Append every document of another dataset, as Megatron's merge does; `on_copied` is
        told the size of every block of tokens copied (for progress)."""
        other = IndexedDataset(other_prefix)
        other.verify()  # the output's pointers are recomputed, but bad lengths would carry over
        if other.dtype != self.dtype:
            raise DataError(
                f"{other.idx_path}: tokens are {other.dtype}, the output is {self.dtype}; "
                "merge only datasets made with the same tokenizer"
            )
        for start in range(0, len(other), _CHUNK):
            self._lengths.write(other.sequence_lengths[start : start + _CHUNK].tobytes())
        docs = other.document_indices
        for start in range(1, len(docs), _CHUNK):
            self._docs.write((docs[start : start + _CHUNK] + self.num_sequences).tobytes())
        buffer = bytearray(_COPY_BLOCK)
        with open(other.bin_path, "rb") as source:
            while size := source.readinto(buffer):
                self._bin.write(memoryview(buffer)[:size])
                if on_copied is not None:
                    on_copied(size)
        self.num_sequences += len(other)
        self.num_documents += other.num_documents
        self.num_tokens += other.num_tokens

    def finalize(self) -> None:
        """Write the `.idx` and move both files into place (`.bin` first, `.idx` last)."""
        finalize_together([self])

    def _stage(self) -> None:
        """Write the `.idx` under its temporary name and flush every file to disk."""
        self._write_index(self._temps[3])
        for handle in (self._bin, self._lengths, self._docs):
            handle.flush()
            os.fsync(handle.fileno())
            handle.close()
        self._index_hold.close()

    def _write_index(self, path: Path) -> None:
        self._lengths.flush()
        self._docs.flush()
        itemsize = self.dtype.itemsize
        header = HEADER.pack(MAGIC, VERSION, self._code, self.num_sequences, self.num_documents + 1)
        with open(path, "wb") as out:
            out.write(header)
            self._lengths.seek(0)
            shutil.copyfileobj(self._lengths, out, 4 * _CHUNK)
            self._lengths.seek(0)
            offset = 0
            while chunk := self._lengths.read(4 * _CHUNK):
                byte_lengths = np.frombuffer(chunk, np.int32).astype(np.int64) * itemsize
                ends = np.cumsum(byte_lengths) + offset
                out.write((ends - byte_lengths).tobytes())
                offset = int(ends[-1])
            self._docs.seek(0)
            shutil.copyfileobj(self._docs, out, 8 * _CHUNK)
            out.flush()
            os.fsync(out.fileno())

    def abort(self) -> None:
        """Drop everything written so far; no output file appears. Closing a handle flushes what
        its buffer holds, which fails again on the full disk that brought us here: that failure
        must not keep the temporary files (as large as everything written so far) on that disk."""
        if self._done:
            return
        self._done = True
        try:
            for handle in (self._bin, self._lengths, self._docs, self._index_hold):
                with contextlib.suppress(OSError):  # the file is closed even when the flush fails
                    handle.close()
        finally:
            self._remove_temps()
            remove_if_empty(self._made_directories)

    def _remove_temps(self) -> None:
        for temp in self._temps:
            temp.unlink(missing_ok=True)

    def __enter__(self) -> IndexedDatasetWriter:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if exc_type is None:
            self.finalize()
        else:
            self.abort()
