"""The quickstart corpus: real English, valid jsonl, deterministic, bounded, de-duplicated."""

from __future__ import annotations

import json
import textwrap
from collections import Counter
from pathlib import Path

import pytest

from gptrain.quickstart.corpus import (
    build_corpus,
    clean_text,
    docstrings_of,
    looks_like_english,
    main,
    package_root,
)

PROSE = (
    "Return a new list containing all items from the iterable in ascending order. "
    "A custom key function can be supplied to customize the sort order, and the reverse "
    "flag can be set to request the result in descending order. The sort is stable, which "
    "means that it does not change the relative order of elements that compare equal."
)
CODE = "x = [f(a, b) for a, b in zip(xs, ys)]\nif x[0] > 1:\n    y = {k: v for k, v in d.items()}\n" * 4


def test_english_filter() -> None:
    assert looks_like_english(PROSE)
    assert not looks_like_english(CODE)
    assert not looks_like_english(PROSE[:150])  # too short to be a useful document
    assert not looks_like_english("Parameter Value Default Description Notes Example " * 10)  # no prose


def test_clean_text_keeps_prose_lines_only() -> None:
    text = (
        "Sort a list.\n\nParameters\n----------\nkey : callable\n    Extracts   a key.\n\n"
        ">>> sorted([3, 1])\n[1, 3]\n... more\n\n\nDone."
    )
    assert (
        clean_text(text) == "Sort a list.\n\nParameters\nkey : callable\nExtracts a key.\n\n[1, 3]\n\nDone."
    )


def test_docstrings_in_source_order() -> None:
    source = textwrap.dedent(
        '''
        """Module doc."""
        class A:
            """Class doc."""
            def f(self):
                """Method doc."""
        async def g():
            """Coroutine doc."""
        def h():
            return "not a docstring"
        '''
    ).encode()
    assert docstrings_of(source) == ["Module doc.", "Class doc.", "Coroutine doc.", "Method doc."]
    assert docstrings_of(b"def broken(:\n") == []


def make_package(root: Path, copies: int) -> Path:
    package = root / "pkg"
    (package / "tests").mkdir(parents=True)
    for index in range(copies):
        (package / f"mod{index}.py").write_text(
            f'"""{PROSE}"""\n\ndef f():\n    """{PROSE} Number {index}."""\n'
        )
    (package / "tests" / "test_x.py").write_text(f'"""{PROSE} From a test."""\n')
    return package


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def test_corpus_is_valid_deterministic_and_deduplicated(tmp_path: Path) -> None:
    sources = [("pkg", make_package(tmp_path, copies=3))]
    first = build_corpus(tmp_path / "a.jsonl", max_bytes=10**9, sources=sources)
    build_corpus(tmp_path / "b.jsonl", max_bytes=10**9, sources=sources)
    assert (tmp_path / "a.jsonl").read_bytes() == (tmp_path / "b.jsonl").read_bytes()
    rows = read_jsonl(tmp_path / "a.jsonl")
    texts = [row["text"] for row in rows]
    assert len(texts) == len(set(texts)) == first.documents
    assert first.bytes == sum(len(text.encode()) for text in texts)
    ours = sorted(row["source"] for row in rows if row["source"].startswith("pkg:"))
    # the module docstring is shared by the three files: kept once; tests/ is skipped
    assert ours == ["pkg:mod0.py", "pkg:mod0.py", "pkg:mod1.py", "pkg:mod2.py"]
    assert any(row["source"].startswith("pydoc:") for row in rows)  # the language reference topics


def test_stdlib_corpus_is_real_english_and_bounded(tmp_path: Path) -> None:
    json_package = package_root("json")
    assert json_package is not None and (json_package / "decoder.py").is_file()
    limit = 300_000
    stats = build_corpus(tmp_path / "c.jsonl", max_bytes=limit, sources=[("stdlib", json_package)])
    rows = read_jsonl(tmp_path / "c.jsonl")
    assert stats.documents == len(rows) > 50
    largest = max(len(row["text"].encode()) for row in rows)
    assert limit <= stats.bytes < limit + largest
    words = Counter(word.lower() for row in rows for word in row["text"].split())
    total = sum(words.values())
    assert words["the"] / total > 0.03 and words["of"] / total > 0.01  # English function words
    assert all(isinstance(row["text"], str) and row["text"].strip() for row in rows)


def test_bad_output_or_size_is_one_line_and_writes_nothing(tmp_path: Path, capsys) -> None:
    """An output that is a directory was a traceback, so was --max-mb nan; --max-mb 0 or below wrote a
    corpus of one document, which then trained on next to nothing."""
    assert main([str(tmp_path), "--max-mb", "0.01"]) == 2
    assert capsys.readouterr().err == f"corpus: error: {tmp_path}: is a directory; give a file name\n"
    for size in ("nan", "0", "-1", "inf", "lots", "1e-9"):  # 1e-9 MiB: 0 bytes
        with pytest.raises(SystemExit) as exited:
            main([str(tmp_path / "c.jsonl"), "--max-mb", size])
        assert exited.value.code == 2
        assert (
            f"argument --max-mb: '{size}': give a positive number of MiB, e.g. 8" in capsys.readouterr().err
        )
    assert list(tmp_path.iterdir()) == []
