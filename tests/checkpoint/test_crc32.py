"""The manifests' CRC-32 is zlib's CRC-32, whichever library computes it."""

import importlib.util
import zlib

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gptrain.checkpoint.crc32 import crc32
from gptrain.checkpoint.integrity import file_crc32


@settings(deadline=None)  # a loaded machine may deschedule one example for longer than 200 ms
@given(st.binary(max_size=4096), st.integers(min_value=0, max_value=2**32 - 1))
def test_values_are_zlibs_from_any_start(data: bytes, start: int) -> None:
    assert crc32(data) == zlib.crc32(data)
    assert crc32(data, start) == zlib.crc32(data, start)


def test_pieces_of_a_tensor_buffer_fold_into_the_whole_files_value() -> None:
    """As the writer feeds it: memoryview pieces of a float32 buffer, the running value carried."""
    values = np.random.default_rng(0).standard_normal(1_000_003).astype(np.float32)
    view = memoryview(values).cast("B")
    running = 0
    for start in range(0, len(view), 1 << 18):
        running = crc32(view[start : start + (1 << 18)], running)
    assert running == zlib.crc32(values.tobytes())


def test_file_checksum_matches_zlib_over_block_boundaries(tmp_path) -> None:
    data = np.random.default_rng(1).integers(0, 256, 3 * (1 << 20) + 17, dtype=np.uint8).tobytes()
    path = tmp_path / "shard.distcp"
    path.write_bytes(data)
    assert file_crc32(path, chunk=1 << 20) == f"{zlib.crc32(data):08x}"


@pytest.mark.skipif(importlib.util.find_spec("isal") is None, reason="isal not installed")
def test_isal_computes_it_where_installed() -> None:
    assert crc32.__module__ == "isal.isal_zlib"
