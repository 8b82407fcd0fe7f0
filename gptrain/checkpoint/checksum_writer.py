"""A DCP FileSystemWriter that checksums every file as it writes it (CRC-32, no second read).

Each rank writes the checksums of its own shard files into a small sidecar
(`.checksums.rank<r>.json`) before its part of the save counts as written; DCP's coordinator
finishes (writes .metadata) only after every rank's write has returned, so by the time rank 0
marks the checkpoint complete every sidecar is on disk, and it merges them into the manifest.
"""

from __future__ import annotations

import json
import os
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

import torch.distributed as dist
from torch.distributed.checkpoint import FileSystemWriter
from torch.distributed.checkpoint.filesystem import FileSystem

from gptrain.checkpoint.crc32 import crc32
from gptrain.checkpoint.direct_io import open_shard_file
from gptrain.utils.atomic import atomic_write_bytes, atomic_write_text

Note = Callable[[str | None], None]
"""What this rank is doing on its own in a save, noted for the run's hang watchdog (None: done)."""
PREPARING = "preparing its checkpoint directory"
WRITING = "writing its checkpoint files"
MARKING = "marking its checkpoint complete"  # rank 0: manifest, COMPLETE, latest, pruning
SIDECAR_PREFIX = ".checksums.rank"
WRITE_PIECE_BYTES = 1 << 18
"""Large buffers are checksummed and written in pieces of this size: the piece is still in the CPU
cache when it is copied on (into a direct file's buffer, or by the kernel into its page cache), and
one buffered write() of a whole 150 MB tensor costs the kernel about 3x the CPU time of the same bytes
in 256 KB pieces (measured: 2.8 s against 0.75 s of CPU for 1.65 GB on the 2-core CI-class VM). CPU
the background writer does not spend is CPU training keeps."""


class _Crc32Stream:
    """Forwards everything to the file in cache-sized pieces; folds each into a running CRC-32."""

    def __init__(self, stream: Any) -> None:
        self._stream = stream
        self.crc = 0

    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        for start in range(0, len(view), WRITE_PIECE_BYTES):
            piece = view[start : start + WRITE_PIECE_BYTES]
            self.crc = crc32(piece, self.crc)
            self._stream.write(piece)
        return len(view)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


class _ChecksummingFileSystem(FileSystem):
    def __init__(self, direct_io: bool) -> None:
        super().__init__()
        self.direct_io = direct_io
        self.checksums: dict[str, str | None] = {}

    @contextmanager
    def create_stream(self, path: Any, mode: str) -> Iterator[Any]:
        if "w" not in mode:
            with super().create_stream(path, mode) as stream:
                yield stream
            return
        file = open_shard_file(path, direct=self.direct_io)
        try:
            wrapped = _Crc32Stream(file)
            yield wrapped
            file.close()  # (a direct file's tail and true length) and the fsync: DCP's own is off
        finally:
            file.discard()
        name = Path(path).name.removesuffix(".tmp")  # .metadata is written as .metadata.tmp, then renamed
        self.checksums[name] = f"{wrapped.crc:08x}"


class ChecksummingWriter(FileSystemWriter):
    """FileSystemWriter whose files get CRC-32s computed while they are written."""

    def __init__(
        self,
        path: str | Path,
        background: bool = False,
        direct_io: bool = False,
        own_files: dict[str, bytes] | None = None,
        note: Note | None = None,
    ) -> None:
        """`own_files`: this rank's files beside its shards ({name: bytes}: its rank file), written
        with them, so that DCP's agreement on the write covers their failure too: written before DCP's
        save, a full disk under one rank's stopped that rank alone, its peers left waiting in DCP's
        first collective until the group timed out. `note`: told what this rank does on its own (its
        directory, its files, rank 0's metadata) while it does it (`noted`)."""
        super().__init__(str(path), sync_files=False)  # each file fsyncs itself as it closes
        self.directory = Path(path)
        self.background = background
        self.fs = _ChecksummingFileSystem(direct_io)
        self.own_files = own_files or {}
        self.note = note

    @property
    def checksums(self) -> dict[str, str | None]:
        return self.fs.checksums

    def prepare_local_plan(self, plan: Any) -> Any:
        with noted(self.note, PREPARING):  # its mkdir, before DCP's gather of the plans
            return super().prepare_local_plan(plan)

    def write_data(self, plan: Any, planner: Any) -> Any:
        if self.background:
            _yield_cpu_to_training()
        with noted(self.note, WRITING):  # done before DCP's gather of every rank's results
            for name, data in self.own_files.items():  # into the sidecar below, hence into the manifest
                atomic_write_bytes(self.directory / name, data)
                self.checksums[name] = f"{crc32(data):08x}"
            with _zip_record_crc_off():
                future = super().write_data(plan, planner)
                future.wait()  # FileSystemWriter writes synchronously; this only surfaces its errors here
            rank = dist.get_rank() if dist.is_available() and dist.is_initialized() else 0
            atomic_write_text(self.directory / sidecar_name(rank), json.dumps(self.checksums) + "\n")
        return future

    def finish(self, metadata: Any, results: Any) -> None:
        with noted(self.note, "writing the checkpoint's metadata"):  # rank 0, the others wait for it
            super().finish(metadata, results)


@contextmanager
def noted(note: Note | None, what: str) -> Iterator[None]:
    """`what` noted while this rank does it (Watchdog.busy): only its own work, never a wait for other
    ranks. A rank noted busy where the others wait is the one the hang's line names: noted while it
    waited for a peer hung before its own note, a healthy rank was named and the hung one excused."""
    if note is None:
        yield
        return
    note(what)
    try:
        yield
    finally:
        note(None)


BACKGROUND_NICE = 19
"""The background writer thread's nice value: the lowest priority of the normal scheduling class."""


def _yield_cpu_to_training() -> None:
    """Lower the calling (background writer) thread to nice 19, so training's threads win the CPU.

    A writer at normal priority preempts one of the training's intra-op threads, and the whole
    parallel region waits for that thread (on 2 cores its async run cost up to 28 s of extra wall
    time against 6-26 s at low priority, 2026-11-23). Linux's SCHED_IDLE, used before, starved the
    writer instead: where training keeps every core busy it wrote 1.65 GB in 10-11 s, longer than the
    6 s between saves, so each save stalled 0.7-1.2 s waiting for the previous one; at nice 19 the
    same writes took 5.6-7.1 s and the stalls were 77-165 ms, for equal or less extra wall time
    (same commands, 2026-11-26, docs/performance.md). Linux keeps a nice value per thread, so only this
    thread changes; elsewhere (macOS, Windows) the thread keeps its priority.
    """
    if sys.platform.startswith("linux"):
        with suppress(OSError):
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), BACKGROUND_NICE)


@contextmanager
def _zip_record_crc_off() -> Iterator[None]:
    """Skip the CRC-32 torch.save's zip writer computes over each record while a shard is written.

    The file-level CRC-32 above already covers every byte and is what a load verifies; the second
    pass was a quarter of the writer's CPU time (0.65 s of 2.5 s per 1.65 GB on 2 cores), taken from
    training while a save writes in the background. torch.load reads such records unchanged. The
    option is process-wide: a torch.save in another thread during the write skips it as well.
    """
    from torch.serialization import get_crc32_options, set_crc32_options

    before = get_crc32_options()
    set_crc32_options(False)
    try:
        yield
    finally:
        set_crc32_options(before)


def sidecar_name(rank: int) -> str:
    return f"{SIDECAR_PREFIX}{rank}.json"


def gathered_checksums(step_dir: Path, own: dict[str, str | None], world_size: int) -> dict[str, str | None]:
    """The sidecars of ranks 0..world_size-1, read by name (a listing may be served from a network file
    system's cache), merged with this rank's own records (rank 0's .metadata among them). A sidecar
    not found is left out: the manifest, which looks up every sidecar too, names it."""
    merged: dict[str, str | None] = {}
    for rank in range(world_size):
        try:
            merged.update(json.loads((step_dir / sidecar_name(rank)).read_text()))
        except FileNotFoundError:
            continue
    merged.update(own)
    return merged


class OwnWork:
    """A background save's own work (its directory, its files, rank 0's metadata, and rank 0's marking
    thread's MARKING), noted from the writer's and the marking thread (a checksum_writer.Note) and passed
    on to the run's note only while the training thread waits for that save (`waited_for`): training
    beside the write is never noted with it, and a rank whose writer waits in DCP's gathers for a
    peer's write is not noted, so that the hang's line names the rank whose own write (or marking)
    hangs, not every rank waiting at the next save."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._what: str | None = None
        self._waiting: tuple[Note, str] | None = None

    def __call__(self, what: str | None) -> None:
        with self._lock:
            self._what = what
            if self._waiting is not None:
                note, step_dir = self._waiting
                note(_waited(what, step_dir) if what is not None else None)

    @contextmanager
    def waited_for(self, note: Note | None, step_dir: str) -> Iterator[None]:
        """Noted while the training thread waits here for the write of `step_dir` and the writer is busy
        with its own work; cleared on leaving, before the collective that agrees on the write."""
        if note is None:
            yield
            return
        with self._lock:
            self._waiting = (note, step_dir)
            if self._what is not None:
                note(_waited(self._what, step_dir))
        try:
            yield
        finally:
            with self._lock:
                self._waiting = None
                note(None)


def _waited(what: str, step_dir: str) -> str:
    """A background save's own work, as noted for the training thread waiting for it."""
    if what == MARKING:
        return f"waiting for its background thread marking {step_dir} complete"
    return f"waiting for its background write of {step_dir}"
