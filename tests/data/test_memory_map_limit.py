"""A blend maps about 11 files per dataset: Linux's default vm.max_map_count (65530) is met near
5,500 shards. mmap then fails with ENOMEM, which was taken for an unreadable cache (rebuilt on every
rank) and then for a file's permissions; it is one line naming the limit and what to do."""

from __future__ import annotations

import errno
import logging
import pickle

import numpy as np
import pytest
from gpt_data_helpers import write_dataset

from gptrain.data.builder import build_gpt_datasets
from gptrain.data.index_cache import IndexCache
from gptrain.data.indexed import IndexedDataset
from gptrain.errors import DataError
from gptrain.utils import limits


def no_map_left(*args, **kwargs):
    raise OSError(errno.ENOMEM, "Cannot allocate memory")


@pytest.fixture
def maps_at_the_limit(monkeypatch):
    """This process as it is when mmap fails for the map count: holding all 65530 maps it may."""
    monkeypatch.setattr(limits, "memory_maps", lambda: (65530, 65530))


def test_running_out_of_memory_maps_is_one_line_naming_vm_max_map_count(
    tmp_path, monkeypatch, maps_at_the_limit
):
    prefix = write_dataset(tmp_path / "shard", [3, 4])
    monkeypatch.setattr(np, "memmap", no_map_left)
    with pytest.raises(DataError) as error:
        IndexedDataset(prefix)
    message = str(error.value)
    assert "\n" not in message and message.startswith(f"{prefix}.idx: ")
    assert "65,530 memory maps" in message and "vm.max_map_count" in message
    assert "sysctl -w vm.max_map_count=131072" in message and "gptrain data merge" in message
    assert "permissions" not in message  # not blamed on the file


def test_a_sound_cache_is_not_rebuilt_when_memory_maps_run_out(
    tmp_path, monkeypatch, caplog, maps_at_the_limit
):
    """The cache was complete: ignoring it rebuilt every index, on every rank, into memory."""
    prefix = write_dataset(tmp_path / "shard", [5] * 40)
    cache = tmp_path / "cache"
    build_gpt_datasets(prefix, "80,10,10", 4, 1, (20, 2, 2), cache_dir=str(cache))
    before = {path.name: path.stat().st_mtime_ns for path in cache.iterdir()}
    real_load = np.load

    def load(*args, **kwargs):
        if kwargs.get("mmap_mode"):
            no_map_left()
        return real_load(*args, **kwargs)

    monkeypatch.setattr(np, "load", load)
    with caplog.at_level(logging.WARNING), pytest.raises(DataError) as error:
        build_gpt_datasets(prefix, "80,10,10", 4, 1, (20, 2, 2), cache_dir=str(cache))
    assert "vm.max_map_count" in str(error.value) and "\n" not in str(error.value)
    assert "-GPTDataset-train-document_index.npy: " in str(error.value)
    assert "unreadable index cache" not in caplog.text
    assert {path.name: path.stat().st_mtime_ns for path in cache.iterdir()} == before


def test_the_line_says_how_many_maps_the_blend_needs(tmp_path, monkeypatch, maps_at_the_limit):
    blend: list[str | float] = []
    for i in range(3):
        blend += [1.0, write_dataset(tmp_path / f"shard{i}", [5] * 40)]
    monkeypatch.setattr(np, "memmap", no_map_left)
    with pytest.raises(DataError) as error:
        build_gpt_datasets(blend, "80,10,10", 4, 1, (20, 2, 2), cache_dir=str(tmp_path / "cache"))
    message = str(error.value)
    assert "\n" not in message and message.startswith(f"{tmp_path / 'shard0'}.idx: ")
    assert "about 33 for its 3 datasets" in message
    assert "sysctl -w vm.max_map_count=131072" in message
    assert pickle.loads(pickle.dumps(error.value)).args == error.value.args  # as a worker sends it


def test_a_large_blend_is_told_a_limit_that_holds_it():
    """6,000 shards need ~66,000 maps besides the process's own: twice the default is not enough."""
    message = limits.out_of_memory_maps("x.idx", (65530, 65530), datasets=6000)
    assert "about 66,000 for its 6,000 datasets" in message
    assert "sysctl -w vm.max_map_count=262144" in message


def test_enomem_far_from_the_map_limit_blames_the_address_space():
    """mmap's ENOMEM is also a full address space (`ulimit -v`): the map count is then not the cause."""
    message = limits.out_of_memory_maps("x.bin", (900, 65530))
    assert "900 of the 65,530" in message and "ulimit -v" in message and "sysctl" not in message


def test_the_cache_says_the_map_limit_too(tmp_path, monkeypatch, maps_at_the_limit):
    cache = IndexCache(tmp_path, "digest", "GPTDataset", "train")
    cache.save({"sample_index": np.zeros(3)}, "d")
    monkeypatch.setattr(np, "load", no_map_left)
    with pytest.raises(DataError, match=r"sample_index\.npy: .*vm\.max_map_count"):
        cache.load(("sample_index",))


def test_the_map_count_is_read_from_proc():
    held, limit = limits.memory_maps()
    try:
        with open("/proc/self/maps") as maps, open("/proc/sys/vm/max_map_count") as most:
            expected_limit = int(most.read())
            expected_held = sum(1 for _ in maps)
    except OSError:
        assert (held, limit) == (None, None)
        return
    assert limit == expected_limit and held is not None and abs(held - expected_held) < 50
