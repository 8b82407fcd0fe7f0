"""The index cache is keyed by the .idx's bytes, not its path or mtime: a copy of the corpus on
each node's disk (new mtimes, another path) finds the indices built from the original, a
rewritten .idx of the same size does not, and a restart on the same files reads no .idx to
compute its key."""

from __future__ import annotations

import hashlib
import os
import shutil
import time
from pathlib import Path

import numpy as np
import pytest
from gpt_data_helpers import write_dataset

from gptrain.data import gpt_dataset, index_cache
from gptrain.data.blended import BlendedDataset
from gptrain.data.gpt_dataset import GPTDataset, build_gpt_indices

LENGTHS = [5, 8, 13, 21, 34]


def _open(prefix: str, cache_dir: Path | None = None) -> GPTDataset:
    return GPTDataset(prefix, range(5), 10, 4, 1, "train", cache_dir=str(cache_dir) if cache_dir else None)


def _arrays(ds: GPTDataset) -> list[list]:
    return [ds.document_index.tolist(), ds.sample_index.tolist(), ds.shuffle_index.tolist()]


def _no_build(*args, **kwargs):
    raise AssertionError("the indices were built again")


def _copy_with_new_mtimes(source: str, target: Path) -> str:
    target.parent.mkdir(parents=True, exist_ok=True)
    later = time.time() + 3600
    for suffix in (".idx", ".bin"):
        shutil.copyfile(source + suffix, str(target) + suffix)  # new inode, ctime and mtime
        os.utime(str(target) + suffix, (later, later))
    return str(target)


def _cache_entries(directory: Path) -> set[str]:
    """The cache's arrays and descriptions (not the memos of .idx digests)."""
    return {p.name for p in directory.iterdir() if p.name.endswith((".npy", "-description.txt"))}


@pytest.mark.parametrize("layout", ["shared cache dir", "cache copied with the data"])
def test_copy_at_another_path_with_new_mtimes_hits_the_cache(tmp_path, monkeypatch, layout):
    prefix = write_dataset(tmp_path / "shared" / "d", LENGTHS)
    shared = tmp_path / "cache" if layout == "shared cache dir" else None
    original = _open(prefix, shared)
    blend = BlendedDataset([original], [1.0], 8, "train", cache_dir=str(shared) if shared else None)
    assert not original.cache_hit and not blend.cache_hit
    if shared is None:  # the default cache sits beside the data and is copied with it
        shutil.copytree(tmp_path / "shared" / "cache", tmp_path / "nvme" / "cache")
    copy = _copy_with_new_mtimes(prefix, tmp_path / "nvme" / "copied")
    cache_dir = shared or tmp_path / "nvme" / "cache" / "GPTDataset_indices"
    before = _cache_entries(cache_dir)
    monkeypatch.setattr(gpt_dataset, "build_gpt_indices", _no_build)
    copied = _open(copy, shared)
    copied_blend = BlendedDataset([copied], [1.0], 8, "train", cache_dir=str(shared) if shared else None)
    assert copied.cache_hit and copied_blend.cache_hit and copied.digest == original.digest
    assert _arrays(copied) == _arrays(original) and _cache_entries(cache_dir) == before
    assert copied_blend.dataset_index.tolist() == blend.dataset_index.tolist()


@pytest.mark.parametrize("how", ["replaced", "rewritten in place"])
def test_rewritten_idx_of_the_same_size_misses_the_cache(tmp_path, how):
    """Other document lengths in files of the same sizes, even with the old mtimes restored."""
    prefix = write_dataset(tmp_path / "d", LENGTHS)
    old = _open(prefix, tmp_path / "c")
    stats = {suffix: os.stat(prefix + suffix) for suffix in (".idx", ".bin")}
    shuffled = [8, 5, 34, 13, 21]  # the same count and total: the same .idx and .bin sizes
    if how == "replaced":  # the writer renames new files into place
        write_dataset(tmp_path / "d", shuffled)
    else:  # the same inodes, written over
        other = write_dataset(tmp_path / "other", shuffled)
        for suffix in (".idx", ".bin"):
            with open(prefix + suffix, "r+b") as handle:
                handle.write(Path(other + suffix).read_bytes())
    for suffix, stat in stats.items():
        while True:  # utime moves ctime to now; wait out a coarse clock so that it differs
            os.utime(prefix + suffix, ns=(stat.st_atime_ns, stat.st_mtime_ns))
            if os.stat(prefix + suffix).st_ctime_ns != stat.st_ctime_ns:
                break
            time.sleep(0.01)
        assert os.stat(prefix + suffix).st_size == stat.st_size
    new = _open(prefix, tmp_path / "c")
    assert not new.cache_hit and new.digest != old.digest
    expected = build_gpt_indices(np.array(shuffled, np.int32), range(5), 10, 4, 1)
    assert _arrays(new) == [a.tolist() for a in expected] != _arrays(old)


def test_restart_reads_no_idx_for_its_digest(tmp_path, monkeypatch):
    """The .idx's digest is kept beside the cache under the file's path, size, mtime, ctime and
    inode: a restart hashes nothing, a copy with a new mtime is hashed once."""
    prefix = write_dataset(tmp_path / "d", LENGTHS)
    first = _open(prefix, tmp_path / "c")
    (memo,) = (tmp_path / "c").glob("idx-*.blake2b")
    idx_bytes = Path(prefix + ".idx").read_bytes()
    assert memo.read_text().strip() == hashlib.blake2b(idx_bytes, digest_size=16).hexdigest()
    hashed: list[str] = []
    real_hash = index_cache.hash_file

    def counting(path, *args, **kwargs):
        hashed.append(str(path))
        return real_hash(path, *args, **kwargs)

    monkeypatch.setattr(index_cache, "hash_file", counting)
    again = _open(prefix, tmp_path / "c")
    assert again.cache_hit and again.digest == first.digest and hashed == []
    later = time.time() + 3600
    os.utime(prefix + ".idx", (later, later))  # as a copy without rsync -t: hashed once, then kept
    for _ in range(2):
        touched = _open(prefix, tmp_path / "c")
        assert touched.cache_hit and touched.digest == first.digest and len(hashed) == 1
    (new_memo,) = set((tmp_path / "c").glob("idx-*.blake2b")) - {memo}
    new_memo.write_text("not a digest\n")  # damaged: hashed again, same key, memo rewritten
    assert _open(prefix, tmp_path / "c").cache_hit and len(hashed) == 2
    assert new_memo.read_text() == memo.read_text()


def test_unwritable_memo_still_finds_the_cache(tmp_path, monkeypatch, caplog):
    """A read-only cache directory cannot keep the digest: it is computed at each start, and loads."""
    prefix = write_dataset(tmp_path / "d", LENGTHS)
    first = _open(prefix, tmp_path / "c")
    copy = _copy_with_new_mtimes(prefix, tmp_path / "copy" / "d")

    def refuse(path, *args, **kwargs):
        raise PermissionError(13, "Permission denied", str(path))

    monkeypatch.setattr(index_cache, "atomic_write_text", refuse)
    caplog.set_level("INFO", logger=index_cache.__name__)
    copied = _open(copy, tmp_path / "c")
    assert copied.cache_hit and copied.digest == first.digest and "it is recomputed next time" in caplog.text


def test_hash_file_reads_in_chunks(tmp_path):
    """Files smaller than, equal to and larger than hashlib's read buffer (256 KiB)."""
    for size in (0, 7, 1 << 18, 100_003 + (1 << 20)):
        data = np.random.default_rng(size).bytes(size)
        (tmp_path / "f").write_bytes(data)
        expected = hashlib.blake2b(data, digest_size=16).hexdigest()
        assert index_cache.hash_file(tmp_path / "f") == expected
