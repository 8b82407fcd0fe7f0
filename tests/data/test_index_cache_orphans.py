"""A builder killed mid-write (SIGKILL, the OOM killer) leaves its temporary file in the index
cache; the next save of that cache removes it once it is old enough to be nobody's."""

import os
import time

import numpy as np

from gptrain.data.index_cache import ORPHAN_AGE_S, IndexCache


def test_old_temporaries_of_this_cache_are_removed_and_live_or_foreign_ones_kept(tmp_path):
    cache = IndexCache(tmp_path, "abc123", "GPTDataset", "train")
    old = time.time() - ORPHAN_AGE_S - 60
    orphan = tmp_path / ".abc123-GPTDataset-train-shuffle_index.npy.k3j2x9.tmp"
    live = tmp_path / ".abc123-GPTDataset-train-sample_index.npy.p0q1r2.tmp"
    foreign = tmp_path / ".ffff00-GPTDataset-train-shuffle_index.npy.aaaaaa.tmp"
    for path in (orphan, live, foreign):
        path.write_bytes(b"x" * 100)
    for path in (orphan, foreign):
        os.utime(path, (old, old))
    cache.save({"shuffle_index": np.arange(5)}, "description")
    assert not orphan.exists()
    assert live.exists() and foreign.exists()  # being written now; another cache key's
    assert np.array_equal(cache.load(("shuffle_index",))["shuffle_index"], np.arange(5))
