"""--legacy-tokenizer reads merges.txt as Megatron's legacy GPT-2 BPE does: `f.read().split('\\n')[1:-1]`,
checked against a small pure-Python reimplementation of that BPE on fixture files."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

from gptrain.cli import main
from gptrain.data.gpt2_bpe import bytes_to_unicode, legacy_merges_note, load_gpt2_bpe
from gptrain.errors import DataError

MERGES = ["Ġ t", "Ġt h", "Ġth e", "a b", "ab c", "x y"]
TEXT = " the abc xy thex abxy the"
HEADER = "#version: 0.2\n"
FILES = {  # name: the merges file's text
    "standard": HEADER + "\n".join(MERGES) + "\n",
    "no_header": "\n".join(MERGES) + "\n",
    "no_final_newline": HEADER + "\n".join(MERGES),
    "neither": "\n".join(MERGES),
    "blank_lines": HEADER + "\n".join(MERGES) + "\n\n\n",
}


def fixture_vocab() -> dict[str, int]:
    """The 256 byte-level characters, then each merge's token in merge order, then <|endoftext|>."""
    vocab = {char: n for n, char in enumerate(bytes_to_unicode().values())}
    for merge in MERGES:
        vocab["".join(merge.split())] = len(vocab)
    vocab["<|endoftext|>"] = len(vocab)
    return vocab


def megatron_legacy_encode(vocab: dict[str, int], merge_file: Path, text: str) -> list[int]:
    """Megatron's legacy GPT2Tokenizer on ASCII words: ranks from `read().split('\\n')[1:-1]`, each
    word's lowest-ranked pair merged everywhere until no pair has a rank (space is Ġ in GPT-2's alphabet)."""
    with open(merge_file, encoding="utf-8") as handle:
        ranks = {tuple(line.split()): rank for rank, line in enumerate(handle.read().split("\n")[1:-1])}
    ids = []
    for word in re.findall(r" ?[a-z]+", text):
        parts = list(word.replace(" ", "Ġ"))
        while len(parts) > 1:
            pairs = {(a, b) for a, b in zip(parts, parts[1:], strict=False) if (a, b) in ranks}
            if not pairs:
                break
            best = min(pairs, key=ranks.__getitem__)
            merged, i = [], 0
            while i < len(parts):
                if tuple(parts[i : i + 2]) == best:
                    merged.append(parts[i] + parts[i + 1])
                    i += 2
                else:
                    merged.append(parts[i])
                    i += 1
            parts = merged
        ids.extend(vocab[part] for part in parts)
    return ids


def write_files(tmp_path: Path, name: str) -> tuple[str, str]:
    vocab = tmp_path / "vocab.json"
    vocab.write_text(json.dumps(fixture_vocab()), encoding="utf-8")
    merges = tmp_path / f"{name}.txt"
    merges.write_bytes(FILES[name].encode("utf-8"))
    return str(vocab), str(merges)


@pytest.mark.parametrize("backend", ["auto", "hf"])
@pytest.mark.parametrize("name", list(FILES))
def test_legacy_ids_are_megatrons_legacy_bpes(tmp_path, name, backend):
    """A merges file without a #version header lost its first merge in Megatron's legacy BPE, and one
    without a final newline its last; gptrain's --legacy-tokenizer kept both and gave other ids
    (" the" one token here, four in Megatron's data)."""
    vocab, merges = write_files(tmp_path, name)
    expected = megatron_legacy_encode(fixture_vocab(), Path(merges), TEXT)
    assert load_gpt2_bpe(vocab, merges, backend=backend, legacy=True).encode(TEXT) == expected


def test_the_fixture_files_differ_where_the_reference_says(tmp_path):
    """The reference drops what Megatron drops (so the test above can fail), and the reading without
    --legacy-tokenizer (Hugging Face's: a #version line skipped, every other line a merge) is unchanged."""
    ids = {}
    for name in FILES:
        vocab, merges = write_files(tmp_path, name)
        ids[name] = megatron_legacy_encode(fixture_vocab(), Path(merges), TEXT)
        assert load_gpt2_bpe(vocab, merges).encode(TEXT) == ids["standard"]
    assert ids["blank_lines"] == ids["standard"]
    assert ids["no_header"] != ids["standard"] and ids["no_final_newline"] != ids["standard"]
    assert ids["neither"] not in (ids["no_header"], ids["no_final_newline"])


def test_the_note_names_each_merge_megatrons_reading_leaves_out(tmp_path):
    for name in ("standard", "blank_lines"):
        assert legacy_merges_note(write_files(tmp_path, name)[1]) is None
    merges = write_files(tmp_path, "neither")[1]
    assert legacy_merges_note(merges) == (
        f"note: {merges}: --legacy-tokenizer reads it as Megatron's legacy GPT-2 BPE does, which never reads "
        "the first line nor the text after the last newline, so it leaves out merge 'Ġ t' (line 1; the "
        "file has no #version header) and merge 'x y' (line 6; the file does not end in a newline): "
        "without --legacy-tokenizer (and in Hugging Face's GPT-2 tokenizer) they are merges, and the ids differ"
    )
    merges = write_files(tmp_path, "no_header")[1]
    assert "merge 'Ġ t' (line 1; the file has no #version header):" in legacy_merges_note(merges)
    assert "line 7" not in legacy_merges_note(merges)


def test_data_prepare_with_legacy_tokenizer_says_it_once(tmp_path, capsys, monkeypatch):
    vocab, merges = write_files(tmp_path, "no_header")
    monkeypatch.chdir(tmp_path)
    Path("in.jsonl").write_text(json.dumps({"text": TEXT}) + "\n" + json.dumps({"text": "the"}) + "\n")
    flags = ["--tokenizer-type", "GPT2BPETokenizer", "--vocab-file", vocab, "--merge-file", merges]
    argv = ["data", "prepare", "--input", "in.jsonl", *flags, "--workers", "2"]
    assert main([*argv, "--output-prefix", "plain"]) == 0
    assert "note:" not in capsys.readouterr().err
    assert main([*argv, "--output-prefix", "legacy", "--legacy-tokenizer"]) == 0
    assert capsys.readouterr().err.count(f"note: {merges}: --legacy-tokenizer") == 1
    expected = [
        i for text in (TEXT, "the") for i in megatron_legacy_encode(fixture_vocab(), Path(merges), text)
    ]
    assert np.fromfile("legacy_text_document.bin", np.uint16).tolist() == expected


def test_a_line_megatron_never_reads_is_still_checked_to_be_a_merge(tmp_path):
    """Without --legacy-tokenizer a vocab.json given as merges.txt is refused at its line 1; the legacy
    reading skips that line, so the whole file (one line, no newline) would have read as no merges."""
    vocab, _ = write_files(tmp_path, "standard")
    with pytest.raises(DataError, match=r"vocab.json:1: expected two space-separated tokens"):
        load_gpt2_bpe(vocab, vocab, legacy=True)
    assert legacy_merges_note(vocab) is None  # no merge left out: the loader's line says what is wrong
