"""A DCP FileSystemWriter that checksums every file as it writes it (CRC-32, no second read).

Each rank writes the checksums of its own shard files into a small sidecar
(`.checksums.rank<r>.json`) before its part of the save counts as written; DCP's coordinator
finishes (writes .metadata) only after every rank's write has returned, so by the time rank 0
marks the checkpoint complete every sidecar is on disk, and it merges them into the manifest.
"""

from __future__ import annotations

import json
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch.distributed as dist
from torch.distributed.checkpoint import FileSystemWriter
from torch.distributed.checkpoint.filesystem import FileSystem

from gptrain.utils.atomic import atomic_write_text

SIDECAR_PREFIX = ".checksums.rank"


class _Crc32Stream:
    """Forwards everything to the file; folds each written chunk into a running CRC-32."""

    def __init__(self, stream: Any) -> None:
        self._stream = stream
        self.crc: int | None = 0

    def write(self, data: Any) -> int:
        if self.crc is not None:
            self.crc = zlib.crc32(memoryview(data).cast("B"), self.crc)
        return self._stream.write(data)

    def seek(self, *args: Any) -> int:
        self.crc = None  # out-of-order writes: no streaming checksum for this file
        return self._stream.seek(*args)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


class _ChecksummingFileSystem(FileSystem):
    def __init__(self) -> None:
        super().__init__()
        self.checksums: dict[str, str | None] = {}

    @contextmanager
    def create_stream(self, path: Any, mode: str) -> Iterator[Any]:
        with super().create_stream(path, mode) as stream:
            if "w" not in mode:
                yield stream
                return
            wrapped = _Crc32Stream(stream)
            yield wrapped
        name = Path(path).name.removesuffix(".tmp")  # .metadata is written as .metadata.tmp, then renamed
        self.checksums[name] = f"{wrapped.crc:08x}" if wrapped.crc is not None else None


class ChecksummingWriter(FileSystemWriter):
    """FileSystemWriter whose files get CRC-32s computed while they are written."""

    def __init__(self, path: str | Path) -> None:
        super().__init__(str(path))
        self.directory = Path(path)
        self.fs = _ChecksummingFileSystem()

    @property
    def checksums(self) -> dict[str, str | None]:
        return self.fs.checksums

    def write_data(self, plan: Any, planner: Any) -> Any:
        future = super().write_data(plan, planner)
        future.wait()  # FileSystemWriter writes synchronously; this only surfaces its errors here
        rank = dist.get_rank() if dist.is_available() and dist.is_initialized() else 0
        atomic_write_text(self.directory / f"{SIDECAR_PREFIX}{rank}.json", json.dumps(self.checksums) + "\n")
        return future


def gathered_checksums(step_dir: Path, own: dict[str, str | None]) -> dict[str, str | None]:
    """Every rank's sidecar merged with this rank's own records (rank 0's .metadata among them)."""
    merged: dict[str, str | None] = {}
    for sidecar in sorted(step_dir.glob(f"{SIDECAR_PREFIX}*.json")):
        merged.update(json.loads(sidecar.read_text()))
    merged.update(own)
    return merged
