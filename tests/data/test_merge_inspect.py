"""`gptrain data merge` (Megatron's merge_datasets) and `gptrain data inspect`."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from gptrain.cli import main
from gptrain.data.indexed import IndexedDatasetWriter


def prepare_argv(inputs: list[Path], prefix: Path, gpt2_files) -> list[str]:
    argv = ["data", "prepare", "--input", *map(str, inputs), "--output-prefix", str(prefix), "--append-eod"]
    return [*argv, "--vocab-file", gpt2_files[0], "--merge-file", gpt2_files[1], "--workers", "1"]


def read_pair(prefix: str) -> tuple[bytes, bytes]:
    return Path(prefix + ".idx").read_bytes(), Path(prefix + ".bin").read_bytes()


def test_merge_equals_one_prepare(tmp_path, gpt2_files, corpus, write_jsonl, megatron_dataset, capsys):
    a = write_jsonl(tmp_path / "a.jsonl", [{"text": t} for t in corpus[:6]])
    b = write_jsonl(tmp_path / "b.jsonl", [{"text": t} for t in corpus[6:]])
    assert main(prepare_argv([a], tmp_path / "a", gpt2_files)) == 0
    assert main(prepare_argv([b], tmp_path / "b", gpt2_files)) == 0
    assert main(prepare_argv([a, b], tmp_path / "ab", gpt2_files)) == 0
    argv = [
        "data",
        "merge",
        "--input",
        str(tmp_path / "a_text_document"),
        str(tmp_path / "b_text_document.idx"),
    ]
    assert main([*argv, "--output-prefix", str(tmp_path / "merged")]) == 0
    assert f"{len(corpus)} documents" in capsys.readouterr().out
    merged = read_pair(str(tmp_path / "merged"))
    assert merged == read_pair(str(tmp_path / "ab_text_document"))
    assert merged == megatron_dataset(corpus, True)


def test_merge_takes_repeated_input_flags(tmp_path, capsys):
    """`--input A --input B` merges both datasets; argparse kept only B."""
    for name, tokens in (("a", [1, 2]), ("b", [3])):
        with IndexedDatasetWriter(str(tmp_path / name), np.uint16) as writer:
            writer.add_document(np.array(tokens))
    argv = ["data", "merge", "--input", str(tmp_path / "a"), "--input", str(tmp_path / "b")]
    assert main([*argv, "--output-prefix", str(tmp_path / "ab")]) == 0
    assert "merged 2 datasets: 2 documents, 3 tokens" in capsys.readouterr().out
    assert np.fromfile(tmp_path / "ab.bin", np.uint16).tolist() == [1, 2, 3]


def test_merge_refuses_a_dataset_named_twice(tmp_path, capsys):
    """A dataset named twice, or by its name and its directory, was copied twice."""
    (tmp_path / "parts").mkdir()
    for name in ("a", "b"):
        with IndexedDatasetWriter(str(tmp_path / "parts" / name), np.uint16) as writer:
            writer.add_document(np.array([1, 2]))
    a, parts = str(tmp_path / "parts" / "a"), str(tmp_path / "parts")
    for inputs, message in (([a, a + ".bin"], f"--input {a}: given twice"), ([parts, a], "given twice")):
        assert main(["data", "merge", "--input", *inputs, "--output-prefix", str(tmp_path / "m")]) == 2
        err = capsys.readouterr().err
        assert message in err and "name each dataset once" in err and err.count("\n") == 1, err
    assert not (tmp_path / "m.bin").exists()
    from gptrain.data.merge import merge_datasets
    from gptrain.errors import DataError

    with pytest.raises(DataError, match="given twice"):  # one string object named twice (the API)
        merge_datasets([a, a], str(tmp_path / "m"))


def test_merge_errors(tmp_path, capsys):
    with IndexedDatasetWriter(str(tmp_path / "small"), np.uint16) as writer:
        writer.add_document(np.array([1, 2]))
    with IndexedDatasetWriter(str(tmp_path / "wide"), np.int32) as writer:
        writer.add_document(np.array([70000]))
    out = tmp_path / "out"
    cases = [
        (["small", "wide"], "wide.idx: tokens are int32, " + f"{tmp_path / 'small.idx'} holds uint16"),
        (["small", "missing"], "missing.bin/.idx not found; check the path"),
    ]
    for names, message in cases:
        argv = [
            "data",
            "merge",
            "--input",
            *(str(tmp_path / n) for n in names),
            "--output-prefix",
            str(out / "m"),
        ]
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert message in err and err.count("\n") == 1
        assert not out.exists() or list(out.iterdir()) == []
    assert (
        main(
            ["data", "merge", "--input", str(tmp_path / "small"), "--output-prefix", str(tmp_path / "small")]
        )
        == 2
    )
    assert "also an input" in capsys.readouterr().err
    blocker = tmp_path / "small.bin"  # a file where the output directory would be
    assert main(["data", "merge", "--input", str(tmp_path / "small"), "--output-prefix", f"{blocker}/m"]) == 2
    assert "m.bin: cannot create the output" in capsys.readouterr().err


@pytest.mark.parametrize("output", ["out/", "out/.", "out/.bin", "."])
def test_merge_refuses_an_output_prefix_that_names_a_directory(tmp_path, capsys, monkeypatch, output):
    """`--output-prefix out/` wrote the hidden files out/.bin and out/.idx: the merge looked empty."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "out").mkdir()
    with IndexedDatasetWriter(str(tmp_path / "small"), np.uint16) as writer:
        writer.add_document(np.array([1, 2]))
    assert main(["data", "merge", "--input", str(tmp_path / "small"), "--output-prefix", output]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "names a directory, not a dataset" in err and "merged.bin/.idx" in err
    assert list((tmp_path / "out").iterdir()) == [] and sorted(p.name for p in tmp_path.glob(".*")) == []


@pytest.fixture
def known_dataset(tmp_path, gpt2) -> str:
    """Document token counts 0, 2, 3, 5, 10 (the 5 split into two sequences)."""
    prefix = str(tmp_path / "known")
    with IndexedDatasetWriter(prefix, np.uint16) as writer:
        writer.add_document(np.array([], dtype=np.int64))
        writer.add_document(np.array(gpt2.encode("hello world")))
        writer.add_document(np.array([1, 2, 3]))
        writer.add_document(np.array([4, 5, 6, 7, 8]), lengths=[2, 3])
        writer.add_document(np.arange(10))
    return prefix


def test_inspect_json(known_dataset, capsys):
    assert main(["data", "inspect", known_dataset, "--json", "--document", "3", "--num-tokens", "4"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["documents"] == 5 and info["empty_documents"] == 1 and info["sequences"] == 5
    assert info["tokens"] == 20 and info["dtype"] == "uint16"
    # Sorted lengths 0 2 3 5 10, linear interpolation: p90 at rank 3.6 -> 5 + 0.6 * 5; p99 at 3.96.
    expected = {"p0": 0.0, "p50": 3.0, "p90": 8.0, "p99": 9.8, "p100": 10.0, "mean": 4.0}
    assert info["document_length"] == pytest.approx(expected)
    assert info["document"] == {"index": 3, "num_tokens": 5, "ids": [4, 5, 6, 7]}  # across two sequences


def test_inspect_text_with_tokenizer(known_dataset, gpt2_files, capsys):
    argv = ["data", "inspect", known_dataset, "--document", "1"]
    assert main([*argv, "--vocab-file", gpt2_files[0], "--merge-file", gpt2_files[1]]) == 0
    out = capsys.readouterr().out
    assert "documents   5 (1 empty)" in out and "tokens      20 (uint16)" in out
    assert "p90 8.0" in out and "document 1: first 2 of 2 tokens" in out
    assert "ids   [31373, 995]" in out and "text  'hello world'" in out


def test_inspect_errors(known_dataset, tmp_path, capsys):
    assert main(["data", "inspect", known_dataset, "--document", "5"]) == 2
    assert "--document 5: the dataset has 5 documents" in capsys.readouterr().err
    assert main(["data", "inspect", str(tmp_path / "nothing")]) == 2
    assert "nothing.bin/.idx not found; check the path" in capsys.readouterr().err
    with pytest.raises(SystemExit):  # argparse names the option (was: exit 0, the document left out)
        main(["data", "inspect", known_dataset, "--num-tokens", "-5"])
    assert "argument --num-tokens: invalid non_negative value: '-5'" in capsys.readouterr().err


def test_inspect_with_a_tokenizer_that_lacks_the_ids_says_so(tmp_path, corpus_writer, capsys):
    """A Hugging Face tokenizer decoded the foreign id 5000 as nothing: the text looked right."""
    overrides = dict(o.split("=", 1) for o in corpus_writer(tmp_path, [np.array([1, 2, 5000, 3])]))
    prefix, tokenizer = overrides["model.data.data_prefix"], overrides["model.tokenizer.model"]
    argv = ["data", "inspect", prefix, "--tokenizer-type", "HuggingFaceTokenizer"]
    assert main([*argv, "--tokenizer-model", tokenizer]) == 2
    err = capsys.readouterr().err
    assert f"{prefix}: document 0 holds token id 5000, not in the tokenizer's 61-token vocabulary" in err


def test_inspect_with_a_tokenizer_names_a_negative_id(tmp_path, corpus_writer, capsys):
    """A .idx whose dtype code says int16 over uint16 tokens: 65535 reads as -1, which the
    tokenizer's decode refused with an OverflowError traceback."""
    overrides = dict(o.split("=", 1) for o in corpus_writer(tmp_path, [np.array([1, 2, 65535, 3])]))
    prefix, tokenizer = overrides["model.data.data_prefix"], overrides["model.tokenizer.model"]
    idx = bytearray(Path(f"{prefix}.idx").read_bytes())
    assert idx[17] == 8  # uint16, after the 9-byte magic and the u64 version
    idx[17] = 3  # int16
    Path(f"{prefix}.idx").write_bytes(bytes(idx))
    argv = ["data", "inspect", prefix, "--tokenizer-type", "HuggingFaceTokenizer"]
    assert main([*argv, "--tokenizer-model", tokenizer]) == 2
    err = capsys.readouterr().err
    assert f"{prefix}: document 0 holds token id -1, and no token id is negative" in err
    assert "Traceback" not in err and err.count("\n") == 1


def overwrite(path: str, offset: int, value: int) -> None:
    with open(path, "r+b") as handle:
        handle.seek(offset)
        handle.write(np.int64(value).tobytes())


def test_corrupt_index_is_a_one_line_error(known_dataset, tmp_path, capsys):
    """Entries the checks on open cannot see: inspect and merge verify the whole .idx."""
    # 5 sequences, document indices [0, 0, 1, 2, 4, 5] at byte 34 + 12 * 5; entry 2 -> 7.
    overwrite(known_dataset + ".idx", 34 + 12 * 5 + 8 * 2, 7)
    assert main(["data", "inspect", known_dataset]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "known.idx: document index entry 3 is 2, less than entry 2 (7)" in err
    assert main(["data", "merge", "--input", known_dataset, "--output-prefix", str(tmp_path / "m")]) == 2
    assert "document index entry 3 is 2" in capsys.readouterr().err
    assert not (tmp_path / "m.idx").exists() and not (tmp_path / "m.bin").exists()


def test_merge_directory_in_name_order(tmp_path, capsys):
    """A directory input means its datasets sorted by name, like Megatron's merge_datasets.py."""
    (tmp_path / "parts").mkdir()
    for name, tokens in (("p2", [7, 8]), ("p1", [1, 2, 3]), ("p10", [9])):
        with IndexedDatasetWriter(str(tmp_path / "parts" / name), np.uint16) as writer:
            writer.add_document(np.array(tokens))
    with IndexedDatasetWriter(str(tmp_path / "expected"), np.uint16) as writer:
        for tokens in ([1, 2, 3], [9], [7, 8]):  # p1, p10, p2
            writer.add_document(np.array(tokens))
    assert (
        main(["data", "merge", "--input", str(tmp_path / "parts"), "--output-prefix", str(tmp_path / "m")])
        == 0
    )
    assert read_pair(str(tmp_path / "m")) == read_pair(str(tmp_path / "expected"))
    assert "merged 3 datasets: 3 documents, 6 tokens" in capsys.readouterr().out  # datasets, not arguments
    argv = ["data", "merge", "--input", str(tmp_path / "parts"), str(tmp_path / "expected")]
    assert main([*argv, "--output-prefix", str(tmp_path / "m2")]) == 0
    assert "merged 4 datasets: 6 documents, 12 tokens" in capsys.readouterr().out
    (tmp_path / "empty").mkdir()
    assert (
        main(["data", "merge", "--input", str(tmp_path / "empty"), "--output-prefix", str(tmp_path / "n")])
        == 2
    )
    assert "holds no .bin/.idx datasets" in capsys.readouterr().err


def test_a_prefix_beside_a_directory_of_its_name_is_the_dataset(tmp_path, capsys):
    """Megatron keeps its index cache in <prefix>/cache/GPTDataset_indices: the prefix of a dataset
    Megatron trained on was taken as that directory, 'holds no .bin/.idx datasets'."""
    a, b = _write(tmp_path / "a_text_document", np.uint16, [[1, 2]]), _write(tmp_path / "b", np.uint16, [[3]])
    (tmp_path / "a_text_document" / "cache" / "GPTDataset_indices").mkdir(parents=True)
    assert main(["data", "merge", "--input", a, b, "--output-prefix", str(tmp_path / "m")]) == 0
    assert np.fromfile(tmp_path / "m.bin", np.uint16).tolist() == [1, 2, 3]
    _write(tmp_path / "a_text_document" / "inner", np.uint16, [[9]])  # now also a directory of datasets
    assert main(["data", "merge", "--input", a, "--output-prefix", str(tmp_path / "n")]) == 2
    err = capsys.readouterr().err
    assert f"--input {a}: both the dataset {a}.bin/.idx and a directory of 1 datasets" in err
    for given, tokens in ((a + ".idx", [1, 2]), (a + "/", [9])):
        assert main(["data", "merge", "--input", given, "--output-prefix", str(tmp_path / "n")]) == 0
        assert np.fromfile(tmp_path / "n.bin", np.uint16).tolist() == tokens


def _write(prefix: Path, dtype: type, documents: list[list[int]]) -> str:
    with IndexedDatasetWriter(str(prefix), dtype) as writer:
        for tokens in documents:
            writer.add_document(np.array(tokens))
    return str(prefix)


@pytest.mark.parametrize("problem", ["dtype", "corrupt index"])
def test_merge_checks_every_input_before_copying(tmp_path, capsys, monkeypatch, problem):
    """A wrong last input is found before any input is copied (merges copy terabytes)."""
    from gptrain.data.indexed import IndexedDatasetWriter as Writer

    inputs = [_write(tmp_path / f"p{n}", np.uint16, [[n, n + 1]] * 3) for n in range(3)]
    if problem == "dtype":
        inputs.append(_write(tmp_path / "wide", np.int32, [[70000]]))
        message = f"wide.idx: tokens are int32, {tmp_path / 'p0.idx'} holds uint16"
    else:
        inputs.append(_write(tmp_path / "bad", np.uint16, [[1], [2, 3]]))
        with open(tmp_path / "bad.idx", "r+b") as handle:  # length of sequence 0: 1 -> -1
            handle.seek(34)
            handle.write(np.int32(-1).tobytes())
        message = "bad.idx: sequence 0 has length -1"
    copied: list[str] = []
    monkeypatch.setattr(Writer, "add_index", lambda self, prefix, **kwargs: copied.append(prefix))
    assert main(["data", "merge", "--input", *inputs, "--output-prefix", str(tmp_path / "out" / "m")]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1
    assert copied == [] and not (tmp_path / "out").exists()


def test_merge_reports_progress_by_bytes_on_stderr(tmp_path, capsys, monkeypatch):
    from gptrain.data import indexed, merge

    monkeypatch.setattr(merge, "PROGRESS_SECONDS", 0.0)  # a line for every block copied
    monkeypatch.setattr(indexed, "_COPY_BLOCK", 64)
    inputs = [_write(tmp_path / f"p{n}", np.uint16, [list(range(100))] * 2) for n in range(2)]
    assert main(["data", "merge", "--input", *inputs, "--output-prefix", str(tmp_path / "m")]) == 0
    out, err = capsys.readouterr()
    lines = err.splitlines()
    assert "merge:" not in out and lines and all(line.startswith("merge: ") for line in lines)
    percents = [float(line.split("%")[0].rsplit(" ", 1)[1]) for line in lines if "%" in line]
    assert len(percents) >= 800 // 64 and percents == sorted(percents) and percents[-1] == 100.0
    assert "MB/s" in lines[-1] and "ETA" in lines[-1] and lines[-1].startswith("merge: 2 datasets")


@pytest.mark.parametrize("per_pass", [1, 2, 3, 1 << 22])
def test_document_lengths_in_passes_equal_the_whole_corpus_formula(tmp_path, monkeypatch, per_pass):
    """Empty documents, documents of several sequences, a pass boundary anywhere: the same lengths
    as prefix sums over the whole corpus (the reference, in int64)."""
    from gptrain.data import summary
    from gptrain.data.indexed import IndexedDataset

    generator = np.random.default_rng(per_pass)
    with IndexedDatasetWriter(str(tmp_path / "d"), np.uint16) as writer:
        for _ in range(40):
            pieces = [int(n) for n in generator.integers(0, 6, size=int(generator.integers(0, 4)))]
            writer.add_document(np.ones(sum(pieces), dtype=np.uint16), lengths=pieces)
    dataset = IndexedDataset(str(tmp_path / "d"))
    ends = np.concatenate([[0], np.cumsum(dataset.sequence_lengths, dtype=np.int64)])
    expected = ends[dataset.document_indices[1:]] - ends[dataset.document_indices[:-1]]
    monkeypatch.setattr(summary, "DOCUMENTS_PER_PASS", per_pass)
    assert summary.document_lengths(dataset).tolist() == expected.tolist()


def test_an_input_directory_that_cannot_be_listed_is_named_with_what_to_do(tmp_path, capsys, monkeypatch):
    """Was 'gptrain: error: <dir>: Permission denied (GPTRAIN_DEBUG=1 shows where)'. Root may list any
    directory, so the refusal of a shared file system's permissions is stood in for."""
    import errno
    import os

    parts = tmp_path / "parts"
    _write(parts / "p1", np.uint16, [[1, 2]])
    real_listdir = os.listdir

    def listdir(path="."):
        if os.fspath(path) == str(parts):
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), os.fspath(path))
        return real_listdir(path)

    monkeypatch.setattr(os, "listdir", listdir)
    assert main(["data", "merge", "--input", str(parts), "--output-prefix", str(tmp_path / "m")]) == 2
    err = capsys.readouterr().err
    assert err == (
        f"gptrain: error: --input {parts}: the directory cannot be listed (Permission denied); check its "
        "permissions, or give the prefixes of its datasets\n"
    )
    assert not (tmp_path / "m.bin").exists() and not (tmp_path / "m.idx").exists()


def test_merge_of_one_dataset_says_each_count_in_the_singular(tmp_path, capsys):
    """One dataset of one one-token document printed "merged 1 datasets: 1 documents, 1 tokens"."""
    with IndexedDatasetWriter(str(tmp_path / "a"), np.uint16) as writer:
        writer.add_document(np.array([5]))
    assert (
        main(["data", "merge", "--input", str(tmp_path / "a"), "--output-prefix", str(tmp_path / "m")]) == 0
    )
    assert f"merged 1 dataset: 1 document, 1 token -> {tmp_path / 'm'}.bin/.idx" in capsys.readouterr().out


def test_prepare_of_one_document_says_each_count_in_the_singular(tmp_path, capsys, gpt2_files):
    """One one-token document with one bad line printed 'prepared 1 documents (0 empty, 1 bad lines
    skipped) as 1 sequences, 1 tokens'."""
    (tmp_path / "in.jsonl").write_text('{"text": "a"}\nnot json\n')
    vocab, merges = gpt2_files
    argv = ["data", "prepare", "--input", str(tmp_path / "in.jsonl"), "--output-prefix", str(tmp_path / "o")]
    assert (
        main([*argv, "--vocab-file", vocab, "--merge-file", merges, "--skip-bad-lines", "--workers", "1"])
        == 0
    )
    assert (
        "prepared 1 document (0 empty, 1 bad line skipped) as 1 sequence, 1 token in "
        in capsys.readouterr().out
    )


def test_inspect_with_a_tokenizer_of_another_vocabulary_than_the_datas_warns(tmp_path, gpt2_files, capsys):
    """`data inspect PREFIX --vocab-file` decoded with another vocabulary than the data's silently, as
    `data sample` did: the same warning, naming both tokenizers' files; a copy of the files is quiet."""
    import shutil

    source = tmp_path / "in.jsonl"
    source.write_text(json.dumps({"text": " a b a b"}) + "\n")
    vocab, merges = gpt2_files
    argv = ["data", "prepare", "--input", str(source), "--output-prefix", str(tmp_path / "ds")]
    assert main([*argv, "--vocab-file", vocab, "--merge-file", merges]) == 0
    table = json.loads(Path(vocab).read_text(encoding="utf-8"))
    table["Ġa"], table["Ġb"] = table["Ġb"], table["Ġa"]
    other = tmp_path / "vocab.json"
    other.write_text(json.dumps(table), encoding="utf-8")
    prefix = str(tmp_path / "ds_text_document")
    copy = str(shutil.copy(vocab, tmp_path / "copied.json"))
    capsys.readouterr()
    assert main(["data", "inspect", prefix, "--json", "--vocab-file", copy, "--merge-file", merges]) == 0
    out, err = capsys.readouterr()
    assert err == ""
    assert (
        main(["data", "inspect", prefix, "--json", "--vocab-file", str(other), "--merge-file", merges]) == 0
    )
    err = capsys.readouterr().err
    assert err.startswith(
        f"gptrain: warning: {prefix} was tokenized with GPT2BPETokenizer {vocab} + {merges} ({prefix}.tokenizer), "
        f"the tokenizer given is GPT2BPETokenizer {other} + {merges}: the same size, other tokens at the same ids"
    )


def test_merge_of_a_gapped_vocabularys_old_int32_and_new_uint16_data_says_to_prepare_the_old_again(
    tmp_path, capsys
):
    """A vocabulary of fewer than 65,500 tokens with an id past 65,499 was prepared int32 by gptrain
    before 5c0c0d04 and is uint16 now (as Megatron); merging the two said 'merge only datasets made
    with the same tokenizer', false for them. Now the line says why and which to prepare again: as
    a condition where no tokenizer record beside the inputs tells (Megatron's data has none)."""
    document = [257, 32, 256, 65510]  # 'abc ab' and the end of document of such a vocabulary
    new = _write(tmp_path / "new", np.uint16, [document])
    old = _write(tmp_path / "old", np.int32, [document])
    for inputs in ([new, old], [old, new]):
        assert main(["data", "merge", "--input", *inputs, "--output-prefix", str(tmp_path / "m")]) == 2
        err = capsys.readouterr().err
        first, second = (Path(prefix + ".idx") for prefix in inputs)
        theirs, its = ("int32", "uint16") if inputs[1] == old else ("uint16", "int32")
        assert err == (
            f"gptrain: error: {second}: tokens are {theirs}, {first} holds {its}; "
            "merge only datasets made with the same tokenizer, "
            "or, where they were (a vocabulary of fewer than 65,500 tokens whose ids reach 65,499..65,535; "
            f"{inputs[0]} has no .tokenizer record to tell), prepare {old} again: {WHY_INT32}\n"
        )
    other = _write(tmp_path / "other", np.int64, [document])  # no dtype gptrain ever chose: no such note
    assert main(["data", "merge", "--input", new, other, "--output-prefix", str(tmp_path / "m")]) == 2
    assert capsys.readouterr().err.endswith(
        "holds uint16; merge only datasets made with the same tokenizer\n"
    )
    assert not (tmp_path / "m.bin").exists()


WHY_INT32 = (
    "gptrain wrote such a vocabulary's tokens as int32 before it took Megatron's rule for the .bin dtype "
    "(the count of tokens, not the highest id + 1), and writes uint16 now, as Megatron does"
)


def _prepare_abc(tmp_path: Path, name: str, tokenizer: list[str]) -> str:
    """'abc ab' (its ids, for NullTokenizer) prepared into `name`_text_document; `tokenizer` is
    ["null", --vocab-size] or ["gpt2", the <|endoftext|> id of a byte-level vocabulary of 259 tokens]."""
    from gptrain.data.gpt2_bpe import bytes_to_unicode

    prefix, kind = tmp_path / name, tokenizer[0]
    (tmp_path / f"{name}.jsonl").write_text(
        '{"text": "257 32 256"}\n' if kind == "null" else '{"text": "abc ab"}\n'
    )
    argv = ["data", "prepare", "--input", str(tmp_path / f"{name}.jsonl"), "--output-prefix", str(prefix)]
    if kind == "null":
        argv += ["--tokenizer-type", "NullTokenizer", "--vocab-size", tokenizer[1]]
    else:  # ids between 257 and the end of document unassigned
        prefix.mkdir()
        vocab = {char: n for n, char in enumerate(bytes_to_unicode().values())}
        vocab |= {"ab": 256, "abc": 257, "<|endoftext|>": int(tokenizer[1])}
        (prefix / "vocab.json").write_text(json.dumps(vocab))
        (prefix / "merges.txt").write_text("#version: 0.2\na b\nab c\n")
        argv += ["--vocab-file", str(prefix / "vocab.json"), "--merge-file", str(prefix / "merges.txt")]
        argv += ["--append-eod"]
    assert main([*argv, "--workers", "1"]) == 0
    return f"{prefix}_text_document"


def test_merge_of_uint16_and_int32_data_says_what_their_tokenizer_records_show(tmp_path, capsys):
    """Every uint16/int32 pair was told to prepare the int32 one again where it was a vocabulary
    numbered with a gap, also where the .tokenizer records beside the inputs show it is not: other
    vocabularies (prepared again, int32 again) or NullTokenizer (no gaps). Now the records decide
    where they can: the note as certain for one vocabulary of ids to 65,499..65,535, the vocabulary
    line for two, none for NullTokenizer; the condition only where a record cannot tell."""
    new = _prepare_abc(tmp_path, "gapped", ["gpt2", "65510"])  # 259 tokens, ids to 65510: uint16
    old = _write(tmp_path / "old_text_document", np.int32, [[257, 32, 256, 65510]])  # as gptrain wrote it
    record = Path(new + ".tokenizer").read_text()
    Path(old + ".tokenizer").write_text(record)
    merge = ["data", "merge", "--output-prefix", str(tmp_path / "m"), "--input"]
    assert main([*merge, new, old]) == 2
    files = f"GPT2BPETokenizer {tmp_path}/gapped/vocab.json + {tmp_path}/gapped/merges.txt"
    assert capsys.readouterr().err == (
        f"gptrain: error: {old}.idx: tokens are int32, {new}.idx holds uint16, both of one vocabulary "
        f"({files}, ids to 65510, by their .tokenizer records): prepare {old} again: {WHY_INT32}\n"
    )
    Path(old + ".tokenizer").write_text(json.dumps({"type": "GPT2BPETokenizer", "legacy": False}))
    assert main([*merge, new, old]) == 2  # a record of before vocabularies were recorded: cannot tell
    assert capsys.readouterr().err.endswith(
        f"65,499..65,535; the .tokenizer record of {old} keeps no vocabulary to tell), prepare {old} "
        f"again: {WHY_INT32}\n"
    )
    dense = _prepare_abc(tmp_path, "dense", ["gpt2", "258"])  # ids to 258: uint16 by either rule
    int32 = _write(tmp_path / "int32_text_document", np.int32, [[257, 32, 256, 258]])  # by no gptrain
    Path(int32 + ".tokenizer").write_text(Path(dense + ".tokenizer").read_text())
    assert main([*merge, dense, int32]) == 2
    assert capsys.readouterr().err.endswith(
        "holds uint16; merge only datasets made with the same tokenizer\n"
    )
    far = _prepare_abc(tmp_path, "far", ["gpt2", "70000"])  # int32: ids past uint16
    assert main([*merge, new, far]) == 2
    assert capsys.readouterr().err == (
        f"gptrain: error: --input {far} was tokenized with GPT2BPETokenizer {tmp_path}/far/vocab.json + "
        f"{tmp_path}/far/merges.txt, {new} with {files} (their .tokenizer records): 70001 tokens, not "
        "65511: another vocabulary, so the same id means other tokens in each; re-tokenize one with the "
        "other's tokenizer files (gptrain data prepare), then merge\n"
    )
    small, large = (_prepare_abc(tmp_path, f"n{size}", ["null", size]) for size in ("1000", "100000"))
    for first, second, kinds in ((small, large, "both NullTokenizer"), (new, large, "by their")):
        assert main([*merge, first, second]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"gptrain: error: {large}.idx: tokens are int32, {first}.idx holds uint16; ")
        assert kinds in err and "again: gptrain" not in err
    assert not (tmp_path / "m.bin").exists()
