"""A downloaded or extracted shard reaches the disk before its name does (fsync of the file, then of
its directory): a node crash or a power loss could otherwise keep the rename (and the archive's
removal) and lose the data."""

from __future__ import annotations

import gzip
import os
from pathlib import Path

import numpy as np

from gptrain.data.indexed import IndexedDatasetWriter
from gptrain.launch.extraction import extract
from gptrain.launch.resumable_download import download
from gptrain.launch.shards import Shard


def journal(monkeypatch) -> list[tuple[str, str]]:
    """Every fsync (the path of its descriptor), rename and unlink, in order."""
    events: list[tuple[str, str]] = []
    fsync, replace, unlink = os.fsync, os.replace, Path.unlink

    def logged_fsync(fd: int) -> None:
        events.append(("fsync", os.readlink(f"/proc/self/fd/{fd}")))
        fsync(fd)

    def logged_replace(src, dst) -> None:
        replace(src, dst)
        events.append(("rename", str(dst)))

    def logged_unlink(self, missing_ok=False) -> None:
        unlink(self, missing_ok=missing_ok)
        events.append(("unlink", str(self)))

    monkeypatch.setattr(os, "fsync", logged_fsync)
    monkeypatch.setattr(os, "replace", logged_replace)
    monkeypatch.setattr(Path, "unlink", logged_unlink)
    return events


def test_an_extracted_shard_is_on_disk_before_its_archive_is_removed(tmp_path, monkeypatch):
    """Nothing was fsynced: after a crash the rename and the archive's removal could persist and the
    shard's data not, an empty shard that tokenized to 0 documents (exit 0)."""
    archive = tmp_path / "shard.jsonl.gz"
    archive.write_bytes(gzip.compress(b'{"text": "a b c"}\n' * 1000))
    events = journal(monkeypatch)
    target = extract(archive, keep=False)
    assert target.read_bytes() == b'{"text": "a b c"}\n' * 1000
    moved = events.index(("rename", str(target)))
    written = [n for n, (kind, path) in enumerate(events) if kind == "fsync" and ".shard.jsonl." in path]
    assert written and written[-1] < moved  # the data, under its temporary name
    assert ("fsync", str(tmp_path)) in events[moved:]  # the name
    assert events.index(("fsync", str(tmp_path)), moved) < events.index(("unlink", str(archive)))


def test_a_downloaded_shard_is_on_disk_before_its_name(tmp_path, monkeypatch):
    source = tmp_path / "src" / "shard.jsonl"
    source.parent.mkdir()
    source.write_bytes(b'{"text": "a"}\n' * 100)
    dest = tmp_path / "dl" / "shard.jsonl"
    events = journal(monkeypatch)
    download(Shard(source.as_uri()), dest)
    moved = events.index(("rename", str(dest)))
    assert ("fsync", str(dest) + ".part") in events[:moved]
    assert ("fsync", str(dest.parent)) in events[moved:]


def test_finished_datasets_names_are_on_disk(tmp_path, monkeypatch):
    """finalize_together fsynced the four temporaries, never the directory its renames changed."""
    events = journal(monkeypatch)
    with IndexedDatasetWriter(str(tmp_path / "out" / "a"), np.uint16) as writer:
        writer.add_document(np.array([1, 2]))
    moved = events.index(("rename", str(tmp_path / "out" / "a.idx")))
    assert ("fsync", str(tmp_path / "out")) in events[moved:]
