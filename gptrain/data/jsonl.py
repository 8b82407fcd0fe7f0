"""Reading jsonl inputs (plain, .gz, .xz, .zst, .bz2) as chunks of whole lines.

Workers receive raw bytes of complete lines plus the number of the first line, so
they can parse in parallel and still report `file:line` for a bad line; chunks are
numbered in input order and put back in that order by the writer.
"""

from __future__ import annotations

import bz2
import contextlib
import glob
import gzip
import io
import lzma
import os
import stat
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from gptrain.errors import DataError
from gptrain.utils.paths import look_up

# Windows tools (PowerShell 5, Notepad) begin UTF-8 text with it; JSON parsers refuse it.
UTF8_BOM = b"\xef\xbb\xbf"
UTF16_BOMS = (b"\xff\xfe", b"\xfe\xff")  # little- and big-endian (UTF-32LE's starts the same)
# Compression is recognised by content, so a mis-named file still reads.
_MAGIC = {b"\x1f\x8b": "gzip", b"\xfd7zXZ\x00": "xz", b"\x28\xb5\x2f\xfd": "zstd", b"BZh": "bzip2"}


@dataclass(frozen=True)
class Chunk:
    """Complete lines of one input file."""

    path: str
    first_line: int  # 1-based number of the first line in `data`
    data: bytes
    raw_position: int  # bytes of the (possibly compressed) file read so far, for the ETA


def expand_inputs(patterns: list[str]) -> list[Path]:
    """Files in the order given; a glob expands to its matches in sorted order. A name that is a
    file is that file, glob characters or not (`shard[1].jsonl`, as the shell passes it)."""
    paths: list[Path] = []
    for pattern in patterns:
        if glob.has_magic(pattern) and not os.path.lexists(pattern):
            matches = sorted(glob.glob(pattern))
            if not matches:
                raise DataError(f"--input {pattern}: no file matches this pattern")
            paths.extend(Path(m) for m in matches)
        else:
            paths.append(Path(pattern))
    for path in paths:
        _check_input(path)
    _refuse_repeated_files(paths)
    return paths


def _check_input(path: Path) -> None:
    """A readable kind of input: a file or a pipe. A directory above it that this user may not search
    (EACCES) was a bare '<file>: Permission denied', the --input and what to do unsaid."""
    found = look_up(path)
    if found.kind == "missing":
        raise DataError(f"--input {path}: no such file")
    if found.kind == "unreachable":
        raise DataError(f"--input {path}: {found.why}")
    if found.kind == "directory":
        raise DataError(
            f"--input {path}: is a directory; pass its files (e.g. --input '{path}/*.jsonl', quoted)"
        )
    if not (found.kind == "file" or stat.S_ISFIFO(found.mode)):
        raise DataError(f"--input {path}: not a file or a pipe; pass jsonl files")


def is_pipe(path: Path) -> bool:
    """A pipe, read once front to back: `--input <(zstdcat a.zst)`, or /dev/stdin fed by one."""
    return stat.S_ISFIFO(path.stat().st_mode)


def file_identity(path: Path) -> tuple[int, ...]:
    """(device, inode, size, modification time): the same for every name of one file (links, `./a`
    and `a`). Size and time too, since some file systems (SMB without server inodes, NFS with 32-bit
    inode numbers, some FUSE mounts) give two files one inode number."""
    status = path.stat()
    return status.st_dev, status.st_ino, status.st_size, status.st_mtime_ns


def _refuse_repeated_files(paths: list[Path]) -> None:
    """A file named twice (or by a path and a glob, or through a link) would be tokenized twice:
    its documents would sit in the dataset twice, which nobody asks for by accident."""
    seen: dict[tuple[int, ...], Path] = {}
    for path in paths:
        identity = file_identity(path)
        if identity in seen:
            first = seen[identity]
            same = "given twice" if str(first) == str(path) else f"the same file as {first}"
            raise DataError(
                f"--input {path}: {same}; each file is tokenized as often as it is named, so its "
                "documents would be in the dataset twice: name it once (weight corpora when blending)"
            )
        seen[identity] = path


def _compression_of(head: bytes) -> str | None:
    for magic, name in _MAGIC.items():
        if head.startswith(magic):
            return name
    if _starts_with_skippable_frame(head):
        return "zstd"
    return None


def _starts_with_skippable_frame(head: bytes) -> bool:
    """A zstd skippable frame (magic 0x184D2A50 to 0x184D2A5F, little-endian): pzstd begins every
    file with one, ahead of the first compressed frame, so that file has no zstd magic up front."""
    return len(head) >= 4 and 0x50 <= head[0] <= 0x5F and head[1:4] == b"\x2a\x4d\x18"


class _PutBack(io.RawIOBase):
    """A pipe with the bytes already read from it put back in front: a pipe cannot seek."""

    def __init__(self, head: bytes, rest: io.BufferedReader) -> None:
        self._head, self._rest = head, rest

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        if not self._head:
            return self._rest.readinto(buffer)
        size = min(len(buffer), len(self._head))
        buffer[:size], self._head = self._head[:size], self._head[size:]
        return size


def _sniffed(raw: io.BufferedReader) -> tuple[IO[bytes], str | None]:
    """The input from its first byte, and its compression, recognised by its first bytes."""
    head = raw.read(max(map(len, _MAGIC)))  # a buffered read: all of them, unless the input is shorter
    if raw.seekable():
        raw.seek(0)
        return raw, _compression_of(head)
    return io.BufferedReader(_PutBack(head, raw)), _compression_of(head)


def zstd_blocks(raw: IO[bytes], size: int) -> Iterator[bytes]:
    """Decompress frame after frame; unlike zstandard's stream reader, a cut-off frame is an error
    (the download stage extracts with it too: a cut-off archive must not pass for a whole one)."""
    import zstandard

    context = zstandard.ZstdDecompressor()
    frame, inside_frame = context.decompressobj(), False
    while block := raw.read(size):
        while block:
            if out := frame.decompress(block):
                yield out
            if not frame.eof:
                inside_frame = True
                break
            block, frame, inside_frame = frame.unused_data, context.decompressobj(), False
    if inside_frame:
        raise EOFError("zstd stream ends inside a frame")


def _blocks(raw: IO[bytes], kind: str | None, size: int) -> Iterator[bytes]:
    """Decompressed bytes of a file, in blocks of about `size`."""
    if kind == "zstd":
        yield from zstd_blocks(raw, max(1, size // 4))  # text compresses about 4x
        return
    if kind == "gzip":
        opened: contextlib.AbstractContextManager = gzip.GzipFile(fileobj=raw, mode="rb")
    elif kind == "xz":
        opened = lzma.LZMAFile(raw, mode="rb")  # noqa: SIM115 (entered just below)
    elif kind == "bzip2":  # older corpus dumps (Pushshift's); several streams (pbzip2) read as one
        opened = bz2.BZ2File(raw, mode="rb")  # noqa: SIM115 (entered just below)
    else:
        opened = contextlib.nullcontext(raw)
    with opened as stream:
        while block := stream.read(size):
            yield block


def _read_errors() -> tuple[type[BaseException], ...]:
    import zstandard

    return (OSError, EOFError, lzma.LZMAError, zstandard.ZstdError)


def iter_chunks(paths: list[Path], chunk_bytes: int = 1 << 20) -> Iterator[Chunk]:
    """Chunks of about `chunk_bytes` of whole lines, file after file, in order."""
    errors = _read_errors()
    for path in paths:
        with open(path, "rb") as raw:
            kind = None
            try:
                source, kind = _sniffed(raw)
                position = raw.tell if raw.seekable() else lambda: 0  # no ETA through a pipe
                blocks = _universal_newlines(_without_bom(_blocks(source, kind, chunk_bytes), path))
                yield from _file_chunks(path, position, blocks)
            except errors as error:
                what = f"cannot decompress {kind} input" if kind else "cannot read input"
                raise DataError(f"{path}: {what} ({error}); check the file is complete") from None


def _without_bom(blocks: Iterator[bytes], path: Path) -> Iterator[bytes]:
    """The blocks less a byte order mark at the start of the file: it is no part of the first
    document, and left in, that line was refused as not JSON (or skipped, a document lost).
    UTF-16 text (PowerShell 5's `>` and Out-File write it) is refused whole: each line was 'not
    valid JSON', and --skip-bad-lines dropped every document of the file."""
    head = b""
    for block in blocks:
        head += block
        if len(head) >= len(UTF8_BOM):
            break
    if head.startswith(UTF16_BOMS):
        raise DataError(
            f"{path}: UTF-16 text (it starts with a UTF-16 byte order mark); jsonl must be UTF-8: "
            f"convert it (iconv -f UTF-16 -t UTF-8 FILE > FILE.utf8.jsonl)"
        )
    if head := head.removeprefix(UTF8_BOM):
        yield head
    yield from blocks


def _universal_newlines(blocks: Iterator[bytes]) -> Iterator[bytes]:
    """The blocks with every line end as LF: preprocess_data.py reads its input in text mode, where
    a lone CR (old Mac files) ends a line as LF and CRLF do, so a file of CR lines is many documents
    to Megatron (and was one unreadable line here). A raw CR is never inside a JSON string, so no
    text changes. A block's last CR waits for the next block, which may begin with its CRLF's LF."""
    held = b""
    for block in blocks:
        block, held = held + block if held else block, b""
        if b"\r" not in block:
            yield block
            continue
        if block.endswith(b"\r"):
            block, held = block[:-1], b"\r"
        yield block.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
    if held:
        yield b"\n"


def _file_chunks(path: Path, position: Callable[[], int], blocks: Iterator[bytes]) -> Iterator[Chunk]:
    line = 1
    pending: list[bytes] = []  # a line longer than a block accumulates here
    for block in blocks:
        cut = block.rfind(b"\n")
        if cut < 0:
            pending.append(block)
            continue
        data = b"".join([*pending, block[: cut + 1]])
        pending = [block[cut + 1 :]] if cut + 1 < len(block) else []
        yield Chunk(str(path), line, data, position())
        line += data.count(b"\n")
    if pending:
        yield Chunk(str(path), line, b"".join(pending), position())
