"""The data commands with Megatron's NullTokenizer: inspect and sample show pre-tokenized data as
ids; prepare writes text of ids (or arrays of ids) as Megatron's preprocess_data.py does."""

from __future__ import annotations

import json

import numpy as np
import pytest

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


def test_prepare_writes_pretokenized_ids_as_megatrons_null_tokenizer(tmp_path, capsys):
    """Before: prepare refused NullTokenizer, where Megatron's preprocess_data.py reads text of ids
    separated by spaces; a JSON array of ids (Megatron fails on it) is one document's ids too."""
    from gptrain.data.indexed import IndexedDataset
    from gptrain.data.tokenizer_record import read_tokenizer_record

    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text('{"text": "1 2 3"}\n{"text": [4, 5]}\n{"text": ""}\n{"text": "7"}\n')
    argv = ["data", "prepare", "--input", str(corpus), "--output-prefix", str(tmp_path / "out")]
    null = ["--tokenizer-type", "NullTokenizer", "--vocab-size", "300", "--append-eod", "--workers", "1"]
    assert main([*argv, *null]) == 0
    data = IndexedDataset(str(tmp_path / "out_text_document"))
    assert data.dtype == np.uint16
    # the empty document adds no sequence, as in Megatron
    assert [data.get(i).tolist() for i in range(len(data))] == [[1, 2, 3, 299], [4, 5, 299], [7, 299]]
    record = read_tokenizer_record(str(tmp_path / "out_text_document"))
    assert record is not None and record["type"] == "NullTokenizer" and "vocabulary" not in record


def test_prepare_names_the_line_of_an_id_past_the_vocabulary(tmp_path, capsys):
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text('{"text": "1 2 3"}\n{"text": "4 300"}\n')
    argv = ["data", "prepare", "--input", str(corpus), "--output-prefix", str(tmp_path / "out")]
    assert main([*argv, "--tokenizer-type", "NullTokenizer", "--vocab-size", "300", "--workers", "1"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and f"{corpus}:2: value of 'text': token id 300 is not" in err, err
    assert not list(tmp_path.glob("out*"))


def test_skip_bad_lines_skips_the_line_of_an_id_null_tokenizer_cannot_read(tmp_path, capsys):
    """Before: an id past --vocab-size (or a word that is no number) failed the whole chunk, named
    as a line range, even with --skip-bad-lines; now it is that line's problem, skipped and counted."""
    from gptrain.data.indexed import IndexedDataset

    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text(
        '{"text": "1 2 3"}\n{"text": "4 300"}\n{"text": [5, 6]}\n{"text": "7 x"}\n{"text": [-1]}\n'
    )
    argv = ["data", "prepare", "--input", str(corpus), "--output-prefix", str(tmp_path / "out")]
    flags = ["--tokenizer-type", "NullTokenizer", "--vocab-size", "300", "--workers", "1"]
    assert main([*argv, *flags]) == 2
    assert f"{corpus}:2: value of 'text': token id 300" in capsys.readouterr().err
    corpus.write_text('{"text": "1 2 3"}\n{"text": "7 x"}\n')
    assert main([*argv, *flags]) == 2
    assert f"{corpus}:2: value of 'text': 'x' is not a token id" in capsys.readouterr().err
    corpus.write_text(
        '{"text": "1 2 3"}\n{"text": "4 300"}\n{"text": [5, 6]}\n{"text": "7 x"}\n{"text": [-1]}\n'
    )
    assert main([*argv, *flags, "--skip-bad-lines"]) == 0
    assert "(0 empty, 3 bad lines skipped)" in capsys.readouterr().out
    dataset = IndexedDataset(str(tmp_path / "out_text_document"))
    assert [dataset[i].tolist() for i in range(len(dataset))] == [[1, 2, 3], [5, 6]]


def test_prepare_without_vocab_size_names_the_flag(tmp_path, capsys):
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text('{"text": "1 2 3"}\n')
    argv = ["data", "prepare", "--input", str(corpus), "--output-prefix", str(tmp_path / "out")]
    assert main([*argv, "--tokenizer-type", "NullTokenizer"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "--vocab-size" in err, err
    assert not list(tmp_path.glob("out*"))


def test_prepare_says_how_null_tokenizer_takes_an_array_of_other_values(tmp_path, capsys):
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text('{"text": [1, 2.5]}\n')
    argv = ["data", "prepare", "--input", str(corpus), "--output-prefix", str(tmp_path / "out")]
    assert main([*argv, "--tokenizer-type", "NullTokenizer", "--vocab-size", "300", "--workers", "1"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and f"{corpus}:1:" in err and "whole numbers" in err, err


@pytest.mark.parametrize(
    "array, problem",
    [
        ("[1, 2.5]", "item 1 (from 0) of the array of 'text' is 2.5, not a whole number"),
        ("[1, true]", "item 1 (from 0) of the array of 'text' is true, not a whole number"),
        ('[1, "2"]', "item 1 (from 0) of the array of 'text' is \"2\", not a whole number"),
        (
            "[99999999999999999999999]",  # orjson reads it as the float 1e+23
            "value of 'text': token id 99999999999999999999999 is not in NullTokenizer's vocabulary of 300 ids",
        ),
    ],
)
def test_prepare_names_the_item_of_an_id_array_that_is_no_id(tmp_path, capsys, array, problem):
    """Before: each of these blamed item 0 with 'is a number, expected a string'."""
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text(f'{{"text": [7]}}\n{{"text": {array}}}\n')
    argv = ["data", "prepare", "--input", str(corpus), "--output-prefix", str(tmp_path / "out")]
    assert main([*argv, "--tokenizer-type", "NullTokenizer", "--vocab-size", "300", "--workers", "1"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and err.startswith(f"gptrain: error: {corpus}:2: {problem}"), err


def test_prepare_reads_the_null_eod_id_as_the_end_append_eod_adds(tmp_path, capsys):
    """docs/migrating.md listed --null-tokenizer-eod-id among flags accepted with a note: with
    NullTokenizer it is read, without a note; beside another type it is the note."""
    from gptrain.data.indexed import IndexedDataset

    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text('{"text": "1 2"}\n')
    argv = [
        "data",
        "prepare",
        "--input",
        str(corpus),
        "--output-prefix",
        str(tmp_path / "out"),
        "--workers",
        "1",
    ]
    null = ["--tokenizer-type", "NullTokenizer", "--vocab-size", "300", "--append-eod"]
    assert main([*argv, *null, "--null-tokenizer-eod-id", "5"]) == 0
    assert "--null-tokenizer-eod-id" not in capsys.readouterr().err
    assert IndexedDataset(str(tmp_path / "out_text_document"))[0].tolist() == [1, 2, 5]
    main([*argv, "--tokenizer-type", "GPT2BPETokenizer", "--null-tokenizer-eod-id", "5"])
    assert "note: --null-tokenizer-eod-id: accepted, no effect: Megatron reads it for NullTokenizer only" in (
        capsys.readouterr().err
    )


ODD_ID_TEXTS = [
    "",
    "   ",
    " 1 2 ",
    "\t3\n4\r5\x0b6\x0c7",
    "0007 8",
    "12",
    "1_0",
    "+5",
    "\u0661\u0662",
    "5\u00a06",
    "7\x1c8",
    "9" * 19,
    "0" * 25 + "42",
    "1.5",
    "-1",
    "299",
    "300",
]


@pytest.mark.parametrize("odd", ODD_ID_TEXTS)
def test_null_tokenizer_reads_a_batch_as_its_per_word_reading(odd):
    """encode_flat's vectorised path gives what int() word by word gives (Megatron's reading), or
    refuses what that refuses, with the same message, whatever the text around it."""
    from gptrain.data.null_tokenizer import NullTokenizer
    from gptrain.data.tokenizer_wrappers import flat_ids
    from gptrain.errors import ConfigError

    tokenizer = NullTokenizer(300)
    texts = ["1 2 3", odd, "", "4  5\n6", odd + " 7"]
    try:
        expected = flat_ids([tokenizer.encode(text) for text in texts])
    except ConfigError as error:
        with pytest.raises(ConfigError, match=str(error).replace("(", r"\(").replace(")", r"\)")):
            tokenizer.encode_flat(texts)
        return
    tokens, lengths = tokenizer.encode_flat(texts)
    assert tokens.dtype == np.int64 and lengths.dtype == np.int64
    assert tokens.tolist() == expected[0].tolist() and lengths.tolist() == expected[1].tolist()


def test_null_tokenizer_reads_plain_ids_without_a_python_step_per_word(tmp_path, monkeypatch):
    """Before: each text went through encode (int() and a range check per word) after a per-line
    check that read every id once more: 4 of 5 s of prepare on 38 MB. Now text of ASCII digits and
    spaces is read by numpy in one pass, range-checked on the whole array; encode only explains."""
    from gptrain.data.indexed import IndexedDataset
    from gptrain.data.null_tokenizer import NullTokenizer

    def per_word(self, text):
        raise AssertionError("per-word path taken for plain ids")

    monkeypatch.setattr(NullTokenizer, "encode", per_word)
    monkeypatch.setattr("gptrain.data.prepare_lines._ids_problem", per_word)
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text('{"text": "1 2 3"}\n{"text": "4 299"}\n{"text": ""}\n{"text": " 7 "}\n')
    argv = ["data", "prepare", "--input", str(corpus), "--output-prefix", str(tmp_path / "out")]
    assert main([*argv, "--tokenizer-type", "NullTokenizer", "--vocab-size", "300", "--workers", "1"]) == 0
    dataset = IndexedDataset(str(tmp_path / "out_text_document"))
    assert [dataset[i].tolist() for i in range(len(dataset))] == [[1, 2, 3], [4, 299], [7]]


def test_null_tokenizer_batches_of_random_id_text_read_as_word_by_word():
    """20,000 seeded batches of digits, signs, ASCII and Unicode spaces and separators: the
    vectorised path and int() word by word agree on every id and length, or refuse alike."""
    import random

    from gptrain.data.null_tokenizer import NullTokenizer
    from gptrain.data.tokenizer_wrappers import flat_ids
    from gptrain.errors import ConfigError

    rng, tokenizer = random.Random(0), NullTokenizer(1000)
    alphabet = [
        "0",
        "1",
        "9",
        "5",
        " ",
        "  ",
        "\t",
        "\n",
        "\r",
        "\x0b",
        "\x0c",
        "\x1c",
        "\u00a0",
        "-",
        "+",
        "_",
    ]
    alphabet += ["x", "\u0661"]

    def read(how, texts):
        try:
            tokens, lengths = how(texts)
        except ConfigError as error:
            return str(error)
        return tokens.tolist(), lengths.tolist()

    for _ in range(20000):
        texts = ["".join(rng.choices(alphabet, k=rng.randint(0, 12))) for _ in range(rng.randint(0, 4))]
        per_word = read(lambda texts: flat_ids([tokenizer.encode(text) for text in texts]), texts)
        assert read(tokenizer.encode_flat, texts) == per_word, texts


def test_arrays_of_ids_reach_null_tokenizer_as_arrays(tmp_path, monkeypatch, capsys):
    """Before: each JSON array of ids was written out as text ("4 5"), then read back from that text
    (half the CPU of prepare on arrays). Now it goes on as an int64 array; a string beside it in the
    same chunk, an array in a line of sentences, and an id past --vocab-size are read as before."""
    from gptrain.data.indexed import IndexedDataset
    from gptrain.data.null_tokenizer import NullTokenizer

    def not_as_text(*args):
        raise AssertionError("an array of ids was read back from text")

    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text('{"text": [1, 2, 3]}\n{"text": []}\n{"text": [4, 299]}\n')
    argv = ["data", "prepare", "--input", str(corpus), "--output-prefix", str(tmp_path / "out")]
    null = ["--tokenizer-type", "NullTokenizer", "--vocab-size", "300", "--workers", "1"]
    with monkeypatch.context() as patched:
        patched.setattr("gptrain.data.null_tokenizer.plain_ids", not_as_text)
        patched.setattr(NullTokenizer, "encode", not_as_text)
        assert main([*argv, *null, "--append-eod"]) == 0
    dataset = IndexedDataset(str(tmp_path / "out_text_document"))
    assert [dataset[i].tolist() for i in range(len(dataset))] == [[1, 2, 3, 299], [4, 299, 299]]
    assert dataset.num_documents == 3
    corpus.write_text('{"text": [7, 8], "t": ["11 12", ""]}\n{"text": "9 10", "t": [13]}\n')
    assert main([*argv, *null, "--json-keys", "text", "t"]) == 0
    capsys.readouterr()
    texts = IndexedDataset(str(tmp_path / "out_text_document"))
    sentences = IndexedDataset(str(tmp_path / "out_t_document"))
    assert [texts[i].tolist() for i in range(len(texts))] == [[7, 8], [9, 10]]
    assert [sentences[i].tolist() for i in range(len(sentences))] == [[11, 12], [13]]
    corpus.write_text('{"text": [7, 8]}\n{"text": [1, 300]}\n{"text": [-1]}\n{"text": [5]}\n')
    assert main([*argv, *null]) == 2
    assert f"{corpus}:2: value of 'text': token id 300 is not" in capsys.readouterr().err
    assert main([*argv, *null, "--skip-bad-lines"]) == 0
    assert "(0 empty, 2 bad lines skipped)" in capsys.readouterr().out
    dataset = IndexedDataset(str(tmp_path / "out_text_document"))
    assert [dataset[i].tolist() for i in range(len(dataset))] == [[7, 8], [5]]


def test_a_negative_id_alone_in_its_chunk_of_json_arrays_is_refused(tmp_path, capsys):
    """A JSON array's ids are range-checked as one array, below 0 as well as past --vocab-size: with
    no other bad id in the chunk to send it back to the per-word reading, -1 was written as 65535."""
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text('{"text": [7, 8]}\n{"text": [4, -1]}\n')
    out = tmp_path / "out"
    argv = ["data", "prepare", "--input", str(corpus), "--output-prefix", str(out)]
    assert main([*argv, "--tokenizer-type", "NullTokenizer", "--vocab-size", "300", "--workers", "1"]) == 2
    assert capsys.readouterr().err == (
        f"gptrain: error: {corpus}:2: value of 'text': token id -1 is not in NullTokenizer's vocabulary "
        "of 300 ids (0 to 299) (or pass --skip-bad-lines to skip such lines)\n"
    )
    assert not (tmp_path / "out_text_document.bin").exists()


@pytest.mark.parametrize("refused", ['"4 300"', "[4, 300]", "[1, 18446744073709551615]"])
def test_the_first_bad_line_is_named_when_its_ids_are_refused_before_a_later_bad_line(
    tmp_path, capsys, refused
):
    """Ids are checked for the whole chunk after its lines are read: a later line of bad JSON was
    named first, and the line of an id past --vocab-size only after that one was fixed."""
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text(
        f'{{"text": "1 2"}}\n{{"text": {refused}}}\n{{"text": [1, 99999999999999999999999]}}\nnot json\n'
    )
    argv = ["data", "prepare", "--input", str(corpus), "--output-prefix", str(tmp_path / "out")]
    assert main([*argv, "--tokenizer-type", "NullTokenizer", "--vocab-size", "300", "--workers", "1"]) == 2
    assert f"{corpus}:2: value of 'text': token id " in capsys.readouterr().err


def test_null_tokenizer_reads_text_of_only_whitespace_as_no_ids():
    """numpy reads text of only whitespace as one id 0 (where int() word by word reads none):
    plain_ids's count of digit runs against numpy's ids is what keeps that 0 out."""
    from gptrain.data.null_tokenizer import NullTokenizer

    tokens, lengths = NullTokenizer(300).encode_flat([" ", "", "\t\n  \x0b\x0c\r"])
    assert tokens.tolist() == [] and lengths.tolist() == [0, 0, 0]
