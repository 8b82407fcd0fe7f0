"""An error line that quotes a user's input quotes its start: a 1 MB vocab.json given as merges.txt,
or a whole document NullTokenizer cannot read, was repeated whole in the "one-line" error."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gptrain.cli import main
from gptrain.data.gpt2_bpe import load_gpt2_bpe
from gptrain.errors import DataError, excerpt

NULL = ["--tokenizer-type", "NullTokenizer", "--vocab-size", "1000", "--workers", "1"]


def test_excerpt_keeps_a_short_text_whole_and_cuts_a_long_one():
    assert excerpt("a b c") == "'a b c'" and excerpt("x" * 80, quote=False) == "x" * 80
    assert excerpt("日" * 81) == repr("日" * 60) + "… (81 characters)"
    assert excerpt("y" * 1_000_000, quote=False) == "y" * 60 + "… (1,000,000 characters)"


def prepare_error(tmp_path: Path, capsys, records: list[object], flags: list[str]) -> str:
    corpus = tmp_path / "in.jsonl"
    corpus.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records), encoding="utf-8")
    argv = ["data", "prepare", "--input", str(corpus), "--output-prefix", str(tmp_path / "out"), *flags]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0, err[:500]
    return err


def test_a_json_vocab_given_as_merges_txt_is_said_to_be_one_in_a_short_line(tmp_path, capsys, gpt2_files):
    """GPT-2's vocab.json is one line of 1 MB: the error repeated it whole (1,078,632 characters)."""
    vocab, _ = gpt2_files
    flags = ["--tokenizer-type", "GPT2BPETokenizer", "--vocab-file", vocab, "--merge-file", vocab]
    err = prepare_error(tmp_path, capsys, [{"text": "hello"}], flags)
    assert len(err) < 400, len(err)
    assert err.startswith(f"gptrain: error: {vocab}:1: expected two space-separated tokens, got '{{")
    assert err.endswith(
        "characters); it looks like a JSON vocab file: --merge-file takes merges.txt (lines such as 'Ġ t')"
    )


def test_a_long_line_of_a_merges_file_is_quoted_by_its_start(tmp_path):
    merges = tmp_path / "merges.txt"
    merges.write_text("#version: 0.2\n" + "a b c " * 10_000 + "\n", encoding="utf-8")
    (tmp_path / "vocab.json").write_text('{"a": 0}', encoding="utf-8")
    with pytest.raises(DataError) as error:
        load_gpt2_bpe(str(tmp_path / "vocab.json"), str(merges))
    assert str(error.value) == (
        f"{merges}:2: expected two space-separated tokens, got {'a b c ' * 10!r}… (60,000 characters)"
    ), str(error.value)[:300]


def test_a_document_null_tokenizer_cannot_read_is_quoted_by_its_start(tmp_path, capsys):
    """NullTokenizer over plain text: a CJK document has no spaces, so it is one 'word' of 160,000
    characters, and the error held all of them (480 KB)."""
    err = prepare_error(tmp_path, capsys, [{"text": "日本語のテキスト" * 20_000}], NULL)
    assert len(err) < 400, len(err)
    assert f"{'日本語のテキスト' * 7 + '日本語の'!r}… (160,000 characters) is not a token id" in err


def test_an_item_of_an_id_array_that_is_no_id_is_quoted_by_its_start(tmp_path, capsys):
    err = prepare_error(tmp_path, capsys, [{"text": [1, "z" * 100_000]}], NULL)
    assert len(err) < 600, len(err)
    assert f"item 1 (from 0) of the array of 'text' is \"{'z' * 59}… (100,002 characters), not a whole" in err
