"""A blend keeps about 11 files open per dataset: hundreds of shards pass the common soft limit of
1024 open files. gptrain raises the soft limit to the hard one, and running out is one line."""

from __future__ import annotations

import errno
import subprocess
import sys

import numpy as np
import pytest
from gpt_data_helpers import write_dataset

from gptrain.data.indexed import IndexedDataset
from gptrain.errors import DataError

resource = pytest.importorskip("resource")


def test_the_soft_open_file_limit_is_raised_to_the_hard_one():
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard <= 256:
        pytest.skip(f"the hard limit here is {hard}")
    code = (
        "import resource\n"
        "hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]\n"
        "resource.setrlimit(resource.RLIMIT_NOFILE, (256, hard))\n"
        "from gptrain.utils.limits import raise_open_file_limit\n"
        "print(raise_open_file_limit(), resource.getrlimit(resource.RLIMIT_NOFILE)[0], hard)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    returned, now, hard_there = (int(word) for word in done.stdout.split())
    assert now == returned > 256
    assert hard_there == resource.RLIM_INFINITY or now == hard_there


def test_running_out_of_file_descriptors_is_one_line_naming_the_limit(tmp_path, monkeypatch):
    prefix = write_dataset(tmp_path / "shard", [3, 4])

    def no_descriptor_left(*args, **kwargs):
        raise OSError(errno.EMFILE, "Too many open files")

    monkeypatch.setattr(np, "memmap", no_descriptor_left)
    with pytest.raises(DataError) as error:
        IndexedDataset(prefix)
    message = str(error.value)
    assert "\n" not in message and "too many open files (this process may hold " in message
    assert "ulimit -n" in message and "permissions" not in message  # not blamed on the file


@pytest.mark.parametrize(
    ("number", "said"),
    [(errno.EMFILE, "too many open files (this process may hold "), (errno.ENFILE, "fs.file-max")],
)
def test_running_out_while_writing_the_index_cache_is_not_blamed_on_the_directory(
    tmp_path, monkeypatch, number, said
):
    """A big blend's first run has no cache to open: the limit is met writing it, where the error
    said to pass a writable cache directory."""
    from gptrain.data.index_cache import IndexCache

    def no_descriptor_left(*args, **kwargs):
        raise OSError(number, "Too many open files")

    monkeypatch.setattr(np, "save", no_descriptor_left)
    with pytest.raises(DataError) as error:
        IndexCache(tmp_path, "digest", "GPTDataset", "train").save({"sample_index": np.zeros(3)}, "d")
    assert said in str(error.value) and "writable" not in str(error.value)


def test_an_unlimited_soft_limit_is_left_alone(monkeypatch):
    """The cap of 2**20 is for raising; an unlimited soft limit was lowered to it."""
    from gptrain.utils.limits import raise_open_file_limit

    unlimited = resource.RLIM_INFINITY
    calls = []
    monkeypatch.setattr(resource, "getrlimit", lambda which: (unlimited, unlimited))
    monkeypatch.setattr(resource, "setrlimit", lambda which, limits: calls.append(limits))
    assert raise_open_file_limit() == unlimited and calls == []


@pytest.mark.parametrize(
    ("number", "said"),
    [
        (errno.EMFILE, "too many open files (this process may hold "),
        (errno.ENOMEM, "vm.max_map_count"),
        (errno.EIO, "cannot be read (Input/output error)"),
    ],
)
def test_the_largest_id_scan_running_out_is_one_line(tmp_path, monkeypatch, number, said):
    """The scan for the largest token id maps the .bin again: a blend past the open-file or memory-map
    limit met it there, as a traceback."""
    from gptrain.data import token_bound

    dataset = IndexedDataset(write_dataset(tmp_path / "shard", [3, 4]))

    def refused(*args, **kwargs):
        raise OSError(number, {errno.EIO: "Input/output error"}.get(number, "no"))

    monkeypatch.setattr(np, "memmap", refused)
    with pytest.raises(DataError) as error:
        token_bound._scan(dataset)
    message = str(error.value)
    assert "\n" not in message and said in message and str(dataset.bin_path) in message
