"""A downloaded or extracted shard reaches the disk before its name does (fsync of the file, then of
its directory), and a shard found in place is not trusted blindly: a node crash or a power loss
could otherwise keep the rename (and the archive's removal) and lose the data."""

from __future__ import annotations

import gzip
import hashlib
import os
from pathlib import Path

import numpy as np
import pytest

from gptrain.data.indexed import IndexedDatasetWriter
from gptrain.errors import DataError
from gptrain.launch.download import prepare_shard
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


def stage_config(tmp_path: Path, shard: dict) -> dict:
    return {
        "shards": [shard],
        "download_dir": str(tmp_path / "download"),
        "output_dir": str(tmp_path / "prepared"),
        "tokenizer_type": "NullTokenizer",
        "vocab_size": 100,
    }


def test_an_archive_found_in_place_is_checked_against_its_sha256(tmp_path):
    """download() returned an existing archive unverified, with a sha256 configured: a file cut by a
    crash, or another file of that name, was extracted and tokenized as the shard."""
    good = gzip.compress(b'{"text": "1 2"}\n')
    source = tmp_path / "shard.jsonl.gz"
    source.write_bytes(good)
    dest = tmp_path / "download" / "shard.jsonl.gz"
    dest.parent.mkdir()
    dest.write_bytes(good[:10])  # a cut copy
    shard = Shard(source.as_uri(), sha256=hashlib.sha256(good).hexdigest())
    with pytest.raises(DataError) as error:
        download(shard, dest)
    assert str(error.value) == (
        f"{dest}: already there, but its sha256 is {hashlib.sha256(good[:10]).hexdigest()}, not "
        f"{shard.sha256} (data_preparation.shards); the file is kept: delete it to download it again"
    )
    assert dest.read_bytes() == good[:10]
    dest.write_bytes(good)
    assert download(shard, dest) == dest  # the right one is taken as it is


def test_an_empty_extracted_shard_is_refused_not_tokenized_to_nothing(tmp_path):
    """An extracted text found empty (its data lost in a crash after the rename) was taken as the
    shard: 0 documents, exit 0, a whole shard silently out of the blend."""
    source = tmp_path / "shard.jsonl.gz"
    source.write_bytes(gzip.compress(b'{"text": "1 2"}\n'))
    cfg = stage_config(tmp_path, {"url": source.as_uri()})
    plain = tmp_path / "download" / "shard.jsonl"
    plain.parent.mkdir()
    plain.write_bytes(b"")
    with pytest.raises(DataError) as error:
        prepare_shard(cfg, 0)
    assert str(error.value) == (
        f"{plain}: empty, where shard 0's text should be ({source.as_uri()}): cut by a crash while it "
        "was written? delete it, and the next run fetches it again"
    )
