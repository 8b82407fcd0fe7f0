"""The data commands with Megatron's NullTokenizer: inspect and sample show pre-tokenized data as
ids; prepare, which encodes text, refuses it in one line."""

from __future__ import annotations

import json

import numpy as np

from gptrain.cli import main
from gptrain.data.indexed import IndexedDatasetWriter


def write_ids(prefix) -> None:
    with IndexedDatasetWriter(str(prefix), np.uint16) as writer:
        for start in range(20):
            writer.add_document(np.array([*range(start, start + 30), 299], dtype=np.uint16))


def test_inspect_and_sample_show_pretokenized_data_as_ids(tmp_path, capsys):
    """Before: --tokenizer-type NullTokenizer was an unknown type to the data commands."""
    write_ids(tmp_path / "ids")
    null = ["--tokenizer-type", "NullTokenizer", "--vocab-size", "300", "--null-tokenizer-eod-id", "299"]
    assert main(["data", "inspect", str(tmp_path / "ids"), *null]) == 0
    captured = capsys.readouterr()
    assert (
        "  text  '0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22 23 24 25 26 27 28 29 299'"
        in (captured.out)
    )
    assert "--null-tokenizer-eod-id" not in captured.err  # read, not 'no effect'
    args = ["--data-prefix", str(tmp_path / "ids"), "--seq-length", "8", "--num-samples", "2,0,0"]
    assert main(["data", "sample", *args, "--splits-string", "100,0,0", *null]) == 0
    sample = json.loads(capsys.readouterr().out.splitlines()[0])
    assert sample["text"] == " ".join(map(str, sample["tokens"]))


def test_prepare_refuses_the_null_tokenizer_in_one_line(tmp_path, capsys):
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text('{"text": "1 2 3"}\n')
    argv = ["data", "prepare", "--input", str(corpus), "--output-prefix", str(tmp_path / "out")]
    assert main([*argv, "--tokenizer-type", "NullTokenizer", "--vocab-size", "300"]) == 2
    err = capsys.readouterr().err.strip()
    assert (
        err.count("\n") == 0 and "--tokenizer-type NullTokenizer: it has no vocabulary to encode text" in err
    )
    assert not list(tmp_path.glob("out*"))
