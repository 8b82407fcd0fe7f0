"""The data-preparation stage's own files: the mode they get, and which of them it removes."""

import gzip
import os
import stat

import pytest

from gptrain.launch.download import fetch_tokenizer_files
from gptrain.launch.extraction import extract

PAYLOAD = b'{"text": "hello"}\n' * 50


@pytest.fixture(params=[0o022, 0o027])
def umask(request):
    previous = os.umask(request.param)
    try:
        yield request.param
    finally:
        os.umask(previous)


def mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_fetched_tokenizer_files_get_a_plain_writes_mode(tmp_path, umask):
    """They were renamed from a mkstemp part, 0600: a team's shared vocab.json unreadable by the team."""
    source = tmp_path / "source.json"
    source.write_bytes(PAYLOAD)
    dest = tmp_path / "bpe" / "vocab.json"
    fetch_tokenizer_files({"tokenizer": {"vocab_file": str(dest), "vocab_url": source.as_uri()}})
    assert dest.read_bytes() == PAYLOAD and mode(dest) == 0o666 & ~umask


def test_an_extracted_shard_gets_a_plain_writes_mode(tmp_path, umask):
    archive = tmp_path / "00.jsonl.gz"
    archive.write_bytes(gzip.compress(PAYLOAD))
    out = extract(archive)
    assert out.read_bytes() == PAYLOAD and mode(out) == 0o666 & ~umask
