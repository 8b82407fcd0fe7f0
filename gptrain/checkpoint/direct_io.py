"""The files a checkpoint's shards are written to: direct (Linux O_DIRECT) on a local disk, else synced.

Buffered, every 4 KiB page of a shard costs the kernel a page-cache copy and its own bookkeeping,
and the dirty pages then push the training data's cached pages out of memory. Written direct from a
page-aligned buffer, the same bytes cost half the CPU: 0.25 s against 0.50 s for 1.65 GB on the
2-core CI-class VM, at the same or less wall time (2026-11-26, docs/performance.md). That CPU is
taken from training while a save writes in the background.

Direct I/O is the default only on local disk file systems: over NFS each direct write waits for the
server, where buffered writes keep many in flight; on Lustre, GPFS and the like it is unmeasured
(`exp_manager.checkpoint_callback_params.direct_io=true` turns it on). Where a file system refuses
O_DIRECT after all, the file is written through the page cache, so a save never fails for want of it.
"""

from __future__ import annotations

import errno
import io
import mmap
import os
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

ALIGNMENT = 4096
"""Direct writes start and end on multiples of this, in file offset, length and memory: a page,
which covers the 512-byte and 4 KiB logical blocks of disks and the page alignment Lustre asks."""
BUFFER_BYTES = 4 << 20
"""One write() per this many bytes: larger buffers measured no faster (16 MiB: same CPU and wall)."""
LOCAL_DISK_FILE_SYSTEMS = frozenset({"ext2", "ext3", "ext4", "xfs", "btrfs", "f2fs"})


def takes_direct_io(directory: str | os.PathLike[str], mounts: str = "/proc/self/mounts") -> bool:
    """True where `directory` (or its nearest existing parent) is on a local disk file system."""
    if not hasattr(os, "O_DIRECT"):
        return False
    path = Path(directory).absolute()
    while not path.exists():
        path = path.parent
    path = path.resolve()
    try:
        table = Path(mounts).read_text()
    except OSError:
        return False
    best, kind = "", ""
    for line in table.splitlines():
        fields = line.split()
        if len(fields) < 3:
            continue
        point = _unescape_mount_point(fields[1])
        inside = path == Path(point) or Path(point) in path.parents
        if inside and len(point) >= len(best):
            best, kind = point, fields[2]
    return kind in LOCAL_DISK_FILE_SYSTEMS


def _unescape_mount_point(field: str) -> str:
    """/proc/self/mounts writes space, tab, newline and backslash in a mount point as octal escapes."""
    for escaped, plain in (("\\040", " "), ("\\011", "\t"), ("\\012", "\n"), ("\\134", "\\")):
        field = field.replace(escaped, plain)
    return field


def open_shard_file(path: str | os.PathLike[str], direct: bool) -> DirectFile | SyncedFile:
    """A new file for one shard: direct where asked (falling back by itself), else through the cache."""
    return DirectFile(path) if direct else SyncedFile(path)


class SyncedFile(io.FileIO):
    """A plain file whose write() writes everything it is given (a raw write may write less, and
    torch.save's zip writer ignores the count), and whose close() fsyncs it first; discard() closes
    it as it is."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        super().__init__(path, "wb")

    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        done = 0
        while done < len(view):
            with view[done:] as rest:
                done += os.write(self.fileno(), rest)
        return done

    def close(self) -> None:
        if not self.closed:
            os.fsync(self.fileno())
        super().close()

    def discard(self) -> None:
        super().close()


class DirectFile:
    """A write-only file object: what is written is gathered in an aligned buffer, and each full
    buffer is written by a helper thread while the next one fills (the disk and the copy overlap);
    `close()` writes the padded tail, cuts the file to its true length and fsyncs it.

    `flush()` does nothing, since a partial buffer cannot be written direct; `tell()` is the
    logical position. Only sequential writes (what DCP's writer does). A failed write is raised by
    the next write() or close(), and by every one after it: the file is never finished with a gap.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        flags = (
            os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_BINARY", 0)
        )
        self.direct = hasattr(os, "O_DIRECT")
        try:
            self._fd = os.open(path, flags | (os.O_DIRECT if self.direct else 0), 0o644)
        except OSError as error:
            if not self.direct or error.errno != errno.EINVAL:
                raise
            self.direct = False
            self._fd = os.open(path, flags, 0o644)
        self.closed = False
        self._size = BUFFER_BYTES
        self._filled = 0
        self._position = 0
        self._in_flight: Future[None] | None = None
        self._failed: BaseException | None = None
        self._maps: list[mmap.mmap] = []
        self._views: list[memoryview] = []
        self._helper = ThreadPoolExecutor(1, thread_name_prefix="gptrain-direct-io")
        try:
            self._maps = [mmap.mmap(-1, self._size) for _ in range(2)]
            self._views = [memoryview(buffer) for buffer in self._maps]
        except BaseException:
            self.discard()
            raise
        self._buffer = self._views[0]

    def write(self, data: Any) -> int:
        self._raise_if_failed()
        view = memoryview(data).cast("B")
        start = 0
        while start < len(view):
            take = min(len(view) - start, self._size - self._filled)
            self._buffer[self._filled : self._filled + take] = view[start : start + take]
            self._filled += take
            start += take
            if self._filled == self._size:
                self._hand_over_full_buffer()
        self._position += len(view)
        return len(view)

    def tell(self) -> int:
        return self._position

    def flush(self) -> None:
        """Nothing: the buffer goes out when it is full or at close."""

    def fileno(self) -> int:
        return self._fd

    def writable(self) -> bool:
        return True

    def close(self) -> None:
        """Write what is left (padded to the alignment), cut the padding off, fsync, close."""
        if self.closed:
            self._raise_if_failed()
            return
        self.closed = True
        try:
            self._raise_if_failed()
            self._wait_for_write_in_flight()
            if self._filled:
                padded = -(-self._filled // ALIGNMENT) * ALIGNMENT
                self._buffer[self._filled : padded] = bytes(padded - self._filled)
                self._write_out(self._buffer, padded)
                os.ftruncate(self._fd, self._position)
            os.fsync(self._fd)
        finally:
            self.discard()

    def discard(self) -> None:
        """Release the buffers and the descriptor without finishing the file (after a failed write)."""
        self.closed = True
        self._helper.shutdown(wait=True)  # a write in flight still reads its buffer
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
        for view, buffer in zip(self._views, self._maps, strict=True):
            if not buffer.closed:
                view.release()
                buffer.close()

    def _hand_over_full_buffer(self) -> None:
        self._wait_for_write_in_flight()
        try:
            self._in_flight = self._helper.submit(self._write_out, self._buffer, self._size)
        except RuntimeError:  # the interpreter is shutting down and starts no thread: write it here
            self._write_out(self._buffer, self._size)
        self._buffer = self._views[1] if self._buffer is self._views[0] else self._views[0]
        self._filled = 0

    def _wait_for_write_in_flight(self) -> None:
        if self._in_flight is not None:
            in_flight, self._in_flight = self._in_flight, None
            try:
                in_flight.result()
            except BaseException as error:
                self._failed = error
                raise

    def _raise_if_failed(self) -> None:
        if self._failed is not None:
            raise OSError(f"an earlier write to this file failed: {self._failed}") from self._failed

    def _write_out(self, buffer: memoryview, length: int) -> None:
        done = 0
        while done < length:
            try:
                with buffer[done:length] as piece:  # released even on error, so the map can close
                    done += os.write(self._fd, piece)
            except OSError as error:
                if not (self.direct and error.errno == errno.EINVAL):
                    self._failed = error
                    raise
                self._stop_writing_direct()  # accepted at open, refused on write: go through the cache

    def _stop_writing_direct(self) -> None:
        import fcntl  # only where O_DIRECT is: Linux

        flags = fcntl.fcntl(self._fd, fcntl.F_GETFL)
        fcntl.fcntl(self._fd, fcntl.F_SETFL, flags & ~os.O_DIRECT)
        self.direct = False
