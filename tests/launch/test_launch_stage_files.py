"""The data-preparation stage's own files: the mode they get, and which of them it removes."""

import gzip
import os
import stat
import subprocess

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


def stage(tmp_path, url, **keys):
    return {
        "shards": [url],
        "download_dir": str(tmp_path / "raw"),
        "output_dir": str(tmp_path / "out"),
        **keys,
    }


@pytest.fixture
def tokenizing(monkeypatch):
    """data prepare's subprocess, standing in: writes the shard's .bin/.idx (or fails), and records
    the input it was given and whether that input was there."""
    from gptrain.launch import download

    seen = {"inputs": [], "fail": False}

    def run(command):
        source = command[command.index("--input") + 1]
        prefix = command[command.index("--output-prefix") + 1]
        seen["inputs"].append((source, os.path.exists(source)))
        if seen["fail"]:
            return subprocess.CompletedProcess(command, 1)
        for suffix in (".bin", ".idx"):
            with open(f"{prefix}_text_document{suffix}", "wb") as out:
                out.write(b"x")
        return subprocess.CompletedProcess(command, 0)

    monkeypatch.setattr(download.subprocess, "run", run)
    return seen


def gz_shard(tmp_path):
    source = tmp_path / "pile" / "00.jsonl.gz"
    source.parent.mkdir()
    source.write_bytes(gzip.compress(PAYLOAD))
    return source


@pytest.mark.parametrize("keep", [False, True])
def test_an_extracted_shard_is_removed_once_tokenized_unless_kept(tmp_path, tokenizing, keep):
    """NeMo's rm_extracted (true in every release's Pile config) removes each extracted shard, about
    28 GB of the Pile's, once tokenized: the stage kept them all, about 850 GB."""
    from gptrain.launch.download import prepare_shard

    source = gz_shard(tmp_path)
    prefix = prepare_shard(stage(tmp_path, source.as_uri(), keep_extracted=keep), 0)
    plain = tmp_path / "raw" / "00.jsonl"
    assert tokenizing["inputs"] == [(str(plain), True)]
    assert plain.exists() is keep and not (tmp_path / "raw" / "00.jsonl.gz").exists()
    assert os.path.exists(f"{prefix}.bin") and os.path.exists(f"{prefix}.idx") and source.exists()


def test_an_extracted_shard_whose_tokenizing_failed_is_kept_for_the_retry(tmp_path, tokenizing):
    from gptrain.errors import DataError
    from gptrain.launch.download import prepare_shard

    tokenizing["fail"] = True
    cfg = stage(tmp_path, gz_shard(tmp_path).as_uri(), keep_extracted=False)
    with pytest.raises(DataError, match="tokenizing .*00.jsonl failed"):
        prepare_shard(cfg, 0)
    assert (tmp_path / "raw" / "00.jsonl").read_bytes() == PAYLOAD
    tokenizing["fail"] = False
    prepare_shard(cfg, 0)  # the retry tokenizes the kept file: the archive is gone (keep_compressed)
    assert not (tmp_path / "raw" / "00.jsonl").exists()
    assert tokenizing["inputs"][-1] == (str(tmp_path / "raw" / "00.jsonl"), True)


def test_a_shard_given_as_plain_text_is_never_removed(tmp_path, tokenizing):
    """Not extracted by the stage: nothing of it is the stage's to remove."""
    from gptrain.launch.download import prepare_shard

    source = tmp_path / "mine.jsonl"
    source.write_bytes(PAYLOAD)
    prepare_shard(stage(tmp_path, source.as_uri(), keep_extracted=False), 0)
    assert source.read_bytes() == PAYLOAD and (tmp_path / "raw" / "mine.jsonl").read_bytes() == PAYLOAD


def test_a_rerun_after_the_extracted_shard_was_removed_neither_extracts_nor_fails(tmp_path, tokenizing):
    """A requeued or relaunched stage: the shard is tokenized, its archive and extraction are gone."""
    from gptrain.launch.download import prepare_shard

    source = gz_shard(tmp_path)
    cfg = stage(tmp_path, source.as_uri(), keep_extracted=False)
    prefix = prepare_shard(cfg, 0)
    source.unlink()  # nothing to download again either
    assert prepare_shard(cfg, 0) == prefix and len(tokenizing["inputs"]) == 1
    assert sorted(p.name for p in (tmp_path / "raw").iterdir()) == []


def test_an_extracted_shard_left_by_a_task_ended_after_tokenizing_is_removed_on_the_rerun(
    tmp_path, tokenizing
):
    """The task ended (a time limit, a kill) between the tokenizing and the removal."""
    from gptrain.launch.download import extracted_mark, prepare_shard

    cfg = stage(tmp_path, gz_shard(tmp_path).as_uri(), keep_extracted=False)
    prepare_shard(cfg, 0)
    plain = tmp_path / "raw" / "00.jsonl"
    plain.write_bytes(PAYLOAD)  # as the ended task left it: the text and the stage's mark beside it
    extracted_mark(plain).touch()
    prepare_shard(cfg, 0)
    assert sorted((tmp_path / "raw").iterdir()) == [] and len(tokenizing["inputs"]) == 1


@pytest.mark.parametrize("prepared", [False, True], ids=["first-run", "rerun"])
def test_text_the_stage_did_not_extract_is_never_removed(tmp_path, tokenizing, prepared):
    """A shard's text a user decompressed by hand into download_dir, or one an earlier run kept
    (keep_extracted=true, or a gptrain before the key), under the archive's name without its suffix:
    the removal took it on the first run and on a rerun over a prepared shard (review X)."""
    from gptrain.launch.download import prepare_shard

    cfg = stage(tmp_path, gz_shard(tmp_path).as_uri(), keep_extracted=prepared)
    if prepared:
        prefix = prepare_shard(cfg, 0)  # kept: keep_extracted=true
        cfg["keep_extracted"] = False
    else:
        (tmp_path / "raw").mkdir()
        (tmp_path / "raw" / "00.jsonl").write_bytes(PAYLOAD)
    prefix = prepare_shard(cfg, 0)
    assert os.path.exists(f"{prefix}.bin") and len(tokenizing["inputs"]) == 1
    assert sorted(p.name for p in (tmp_path / "raw").iterdir()) == ["00.jsonl"]
    assert (tmp_path / "raw" / "00.jsonl").read_bytes() == PAYLOAD
