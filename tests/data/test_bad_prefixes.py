"""A dataset prefix that names no .bin/.idx pair, given to `gptrain data inspect`, `sample` and
`merge`: one line, exit 2, naming the path and what to do, the same from every command."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from gptrain.cli import main
from gptrain.data.indexed import IndexedDatasetWriter


def write(prefix: Path) -> str:
    with IndexedDatasetWriter(str(prefix), np.uint16) as writer:
        for n in range(20):
            writer.add_document(np.arange(n % 5 + 3))
    return str(prefix)


def commands(prefix: str, tmp_path: Path) -> dict[str, list[str]]:
    return {
        "inspect": ["data", "inspect", prefix],
        "sample": [
            "data",
            "sample",
            "--data-prefix",
            prefix,
            "--seq-length",
            "4",
            "--cache-dir",
            str(tmp_path / "c"),
        ],
        "merge": [
            "data",
            "merge",
            "--input",
            str(tmp_path / "good"),
            prefix,
            "--output-prefix",
            str(tmp_path / "m"),
        ],
    }


def one_line_error(argv: list[str], capsys) -> str:
    assert main(argv) == 2
    captured = capsys.readouterr()
    assert captured.err.startswith("gptrain: error: ") and captured.err.count("\n") == 1, captured.err
    assert "Traceback" not in captured.err and captured.out == ""
    return captured.err


def make_case(tmp_path: Path, case: str) -> tuple[str, str]:
    """(the prefix given, what the error must say)."""
    d = tmp_path
    if case == "missing":
        return str(d / "nope"), f"{d / 'nope'}.bin/.idx not found; check the path, or make the pair"
    if case == "missing directory":
        return str(d / "no" / "x"), f"{d / 'no' / 'x'}.bin/.idx not found; check the path"
    if case in ("bin without idx", "bin without idx, named by its .bin"):
        write(d / "half")
        (d / "half.idx").unlink()
        given = str(d / "half") + (".bin" if case.endswith(".bin") else "")
        return (
            given,
            f"{d / 'half'}.idx not found beside {d / 'half'}.bin (a copy not finished, or a file removed)",
        )
    if case == "idx without bin":
        write(d / "half")
        (d / "half.bin").unlink()
        return str(d / "half"), f"{d / 'half'}.bin not found beside {d / 'half'}.idx"
    if case == "truncated idx":
        prefix = write(d / "cut")
        data = Path(prefix + ".idx").read_bytes()
        Path(prefix + ".idx").write_bytes(data[:100])
        return prefix, f"{prefix}.idx: size 100 bytes, expected {len(data)} for 20 sequences"
    if case == "truncated header":
        prefix = write(d / "cut")
        Path(prefix + ".idx").write_bytes(b"MMIDIDX")
        return prefix, f"{prefix}.idx: truncated (7 bytes, header needs 34)"
    if case == "the jsonl":
        (d / "corpus.jsonl").write_text('{"text": "x"}\n')
        return str(d / "corpus.jsonl"), f"{d / 'corpus.jsonl'}: a file, not the prefix of a .bin/.idx pair"
    if case == "the output prefix of prepare":
        write(d / "out_text_document")
        return str(d / "out"), f"did you mean {d / 'out_text_document'}?"
    if case == "a home directory no shell expanded":
        write(d / "home" / "data" / "ds")
        return (
            "~/data/ds",
            f"~/data/ds.bin/.idx not found; did you mean {d / 'home' / 'data' / 'ds'}? (~ is expanded",
        )
    if case in ("a variable no shell expanded", "a braced variable no shell expanded"):
        write(d / "corpora" / "ds")
        given = "$CORPORA/ds" if case.startswith("a variable") else "${CORPORA}/ds"
        return (
            given,
            f"{given}.bin/.idx not found; did you mean {d / 'corpora' / 'ds'}? ($CORPORA is expanded by a "
            "shell, not in a config file or a quoted argument; a config can write ${oc.env:CORPORA})",
        )
    if case == "permission denied":
        prefix = write(d / "locked" / "ds")
        return (
            prefix,
            f"{prefix}.bin: cannot be looked up (Permission denied); check the permissions of {d / 'locked'}",
        )
    if case == "permission denied further up":  # the directory that refused, not the one holding it
        prefix = write(d / "locked" / "sub" / "ds")
        return (
            prefix,
            f"{prefix}.bin: cannot be looked up (Permission denied); check the permissions of {d / 'locked'} and",
        )
    raise AssertionError(case)


CASES = [
    "missing",
    "missing directory",
    "bin without idx",
    "bin without idx, named by its .bin",
    "idx without bin",
    "truncated idx",
    "truncated header",
    "the jsonl",
    "the output prefix of prepare",
    "a home directory no shell expanded",
    "a variable no shell expanded",
    "a braced variable no shell expanded",
    "permission denied",
    "permission denied further up",
]


@pytest.mark.parametrize("command", ["inspect", "sample", "merge"])
@pytest.mark.parametrize("case", CASES)
def test_a_prefix_of_no_pair_is_one_line_naming_it_and_what_to_do(
    tmp_path, capsys, monkeypatch, refuse_search, command, case
):
    write(tmp_path / "good")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("CORPORA", str(tmp_path / "corpora"))
    prefix, message = make_case(tmp_path, case)
    if case.startswith("permission denied"):
        refuse_search(tmp_path / "locked")
    err = one_line_error(commands(prefix, tmp_path)[command], capsys)
    assert message in err
    assert not (tmp_path / "m.bin").exists() and not (tmp_path / "m.idx").exists()


@pytest.mark.parametrize("command", ["inspect", "sample"])
@pytest.mark.parametrize("datasets", [0, 1, 2])
def test_a_directory_given_as_a_prefix_names_a_dataset_in_it(tmp_path, capsys, command, datasets):
    """Was '<dir>.idx: no such file' (inspect) or '<dir>.bin/.idx not found (run gptrain data prepare
    first)' (sample); `data merge` takes a directory as its datasets, as Megatron's merge does."""
    directory = tmp_path / "data"
    directory.mkdir()
    for name in reversed(("a_text_document", "b_text_document")[:datasets]):  # named in sorted order
        write(directory / name)
    (directory / "notes.txt").write_text("x")
    for given in (str(directory), str(directory) + os.sep):
        err = one_line_error(commands(given, tmp_path)[command], capsys)
        assert f"{given}: a directory, not a dataset prefix" in err
        if datasets:
            assert f"e.g. {os.path.join(given, 'a_text_document')}" in err
            assert ("one of its 2 datasets" in err) == (datasets == 2)
        else:
            assert "it holds no .bin/.idx pair; pass the prefix of a pair" in err


@pytest.mark.parametrize("suffix", [".bin", ".idx"])
def test_a_prefix_given_with_its_suffix_is_the_pair(tmp_path, capsys, suffix):
    """Megatron users often pass data/corpus_text_document.bin: it names the pair."""
    prefix = write(tmp_path / "good")
    assert main(["data", "inspect", prefix + suffix]) == 0
    assert f"dataset     {prefix}\n" in capsys.readouterr().out
    assert main(commands(prefix + suffix, tmp_path)["sample"]) == 0
    assert f'"prefix": "{prefix}"' in capsys.readouterr().out
