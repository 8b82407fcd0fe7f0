"""`gptrain data prepare` on JSON arrays of strings, as Megatron's preprocess_data.py takes them:
each item a sentence, tokenized alone, each non-empty one a sequence of the document."""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gptrain.cli import main
from gptrain.data import prepare as prepare_module
from gptrain.data.indexed import IndexedDatasetWriter
from gptrain.data.jsonl import Chunk
from gptrain.data.prepare import PrepareConfig, prepare
from gptrain.data.prepare_tokens import WorkerState
from gptrain.data.summary import summarize
from gptrain.data.tokenizers import TokenizerSpec

# Every case of Megatron's Encoder.encode: sentences, a plain string, no sentences, only empty
# ones, empty ones around a non-empty one, empty and whitespace strings, a literal EOD, unicode.
DOCUMENTS: list[str | list[str]] = [
    ["Hello", " world"],
    "a plain string",
    [],
    ["", ""],
    ["", "middle", ""],
    "",
    ["a<|endoftext|>b", " ", "Ünïcödé 日本語 🤖"],
    ["one"],
    " ",
    ["x", "y"],
]
EMPTY = 3  # [], ["", ""], "": no tokens at all (" " is one token)
SEQUENCES = 2 + 1 + 0 + 0 + 1 + 0 + 3 + 1 + 1 + 2  # non-empty sentences, document by document


def outputs(prefix: Path, key: str = "text") -> tuple[bytes, bytes]:
    base = f"{prefix}_{key}_document"
    return Path(base + ".idx").read_bytes(), Path(base + ".bin").read_bytes()


def gpt2_spec(gpt2_files) -> TokenizerSpec:
    return TokenizerSpec("GPT2BPETokenizer", *gpt2_files)


def run(tmp_path: Path, config: PrepareConfig):
    with open(tmp_path / "log", "w") as log:
        return prepare(config, stream=log)


def test_sentences_by_hand(tmp_path, gpt2_files, write_jsonl):
    """GPT-2 ids: "Hello" 15496, " world" 995, EOD 50256. The expected pair is written with
    add_document and explicit sequence lengths, Megatron's builder call."""
    lines = [{"text": ["Hello", " world"]}, {"text": ["", "Hello"]}, {"text": []}, {"text": "Hello"}]
    source = write_jsonl(tmp_path / "in.jsonl", lines)
    stats = run(
        tmp_path, PrepareConfig([str(source)], str(tmp_path / "out"), gpt2_spec(gpt2_files), append_eod=True)
    )
    with IndexedDatasetWriter(str(tmp_path / "expected"), np.uint16) as writer:
        writer.add_document(np.array([15496, 995, 50256]), [1, 2])  # the EOD on the last sentence only
        writer.add_document(np.array([15496, 50256]), [2])  # the empty sentence is no sequence
        writer.add_document(np.array([], dtype=np.int64), [])  # no sentences: no sequence, no EOD
        writer.add_document(np.array([15496, 50256]), [2])
    assert outputs(tmp_path / "out") == (
        (tmp_path / "expected.idx").read_bytes(),
        (tmp_path / "expected.bin").read_bytes(),
    )
    assert (stats.documents, stats.empty_documents, stats.sequences) == (4, {"text": 1}, {"text": 4})
    info = summarize(str(tmp_path / "out_text_document"))
    assert (info["documents"], info["empty_documents"], info["sequences"], info["tokens"]) == (4, 1, 4, 7)


@pytest.mark.parametrize(("workers", "append_eod"), [(1, True), (1, False), (2, True)])
def test_sentences_match_megatron_reference(
    tmp_path, gpt2_files, real_texts, reference_encode, write_jsonl, megatron_dataset, workers, append_eod
):
    """Lists and strings mixed, chunks of a few lines (some with lists, some without), any worker count."""
    documents = [*DOCUMENTS, *(text.split("\n") for text in real_texts), *real_texts]
    source = write_jsonl(tmp_path / "in.jsonl", [{"text": d} for d in documents])
    config = PrepareConfig(
        [str(source)], str(tmp_path / "out"), gpt2_spec(gpt2_files), append_eod=append_eod, workers=workers,
        chunk_bytes=64,
    )  # fmt: skip
    stats = run(tmp_path, config)
    assert outputs(tmp_path / "out") == megatron_dataset(documents, append_eod)
    sentences = [s for d in documents for s in (d if isinstance(d, list) else [d])]
    assert stats.sequences == {"text": sum(1 for s in sentences if reference_encode(s))}
    assert stats.documents == len(documents) and stats.empty_documents == {"text": EMPTY}


def test_keys_of_lists_and_strings_side_by_side(tmp_path, gpt2_files, write_jsonl, megatron_dataset, capsys):
    """Each --json-keys key is a dataset of its own: one of lists, one of strings; the summary
    counts each key's sequences (what a split string divides) beside the documents."""
    records = [{"text": d, "title": f"title {n}"} for n, d in enumerate(DOCUMENTS)]
    source = write_jsonl(tmp_path / "in.jsonl", records)
    argv = ["data", "prepare", "--input", str(source), "--output-prefix", str(tmp_path / "out")]
    argv += ["--json-keys", "text", "title", "--vocab-file", gpt2_files[0], "--merge-file", gpt2_files[1]]
    assert main([*argv, "--workers", "1"]) == 0
    assert outputs(tmp_path / "out", "text") == megatron_dataset(DOCUMENTS, False)
    assert outputs(tmp_path / "out", "title") == megatron_dataset([r["title"] for r in records], False)
    line = capsys.readouterr().out
    count = len(DOCUMENTS)
    assert f"prepared {count} documents ({EMPTY} empty text, 0 empty title, 0 bad lines skipped) as " in line
    assert f" as {SEQUENCES} sequences text, {count} sequences title, " in line


BAD_SENTENCES = [
    (b'{"text": ["ok", null]}', "item 1 (from 0) of the array of 'text' is null, expected a string"),
    (b'{"text": [true]}', "item 0 (from 0) of the array of 'text' is a boolean, expected a string"),
    (
        b'{"text": ["ok", {"s": "x"}]}',
        "item 1 (from 0) of the array of 'text' is an object, expected a string",
    ),
    (
        b'{"text": ["ok", "bad \\ud800"]}',
        "item 1 (from 0) of the array of 'text' holds a lone surrogate \\ud800",
    ),
]


@pytest.mark.parametrize(("line", "message"), BAD_SENTENCES)
def test_bad_sentence_stops_naming_file_line_and_item(tmp_path, gpt2_files, capsys, line, message):
    source = tmp_path / "in.jsonl"
    source.write_bytes(b'{"text": ["one", "two"]}\n{"text": "three"}\n' + line + b"\n")
    argv = ["data", "prepare", "--input", str(source), "--output-prefix", str(tmp_path / "out" / "o")]
    argv += ["--vocab-file", gpt2_files[0], "--merge-file", gpt2_files[1]]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"gptrain: error: {source}:3: {message}")
    assert not (tmp_path / "out").exists()  # nor the directory made for the output


@pytest.mark.parametrize("workers", [1, 2])
def test_skip_bad_lines_skips_bad_sentences(tmp_path, gpt2_files, megatron_dataset, workers):
    good = [["one", " two"], "three", ["", "four"], []]
    lines = [json.dumps({"text": good[0]}).encode(), *(line for line, _ in BAD_SENTENCES)]
    lines += [json.dumps({"text": d}).encode() for d in good[1:]]
    source = tmp_path / "in.jsonl"
    source.write_bytes(b"\n".join(lines) + b"\n")
    config = PrepareConfig(
        [str(source)], str(tmp_path / "out"), gpt2_spec(gpt2_files), append_eod=True, workers=workers,
        skip_bad_lines=True, chunk_bytes=32,
    )  # fmt: skip
    stats = prepare(config, stream=sys.stdout)
    assert outputs(tmp_path / "out") == megatron_dataset(good, True)
    assert (stats.documents, stats.bad_lines, stats.sequences) == (4, len(BAD_SENTENCES), {"text": 4})


class CharTokenizer:
    """One token per character (its code point): any text, no BPE, for the property test."""

    eod = 1
    vocab_size = 256

    def encode_flat(self, texts):
        lengths = np.array([len(text) for text in texts], dtype=np.int64)
        return np.array([ord(c) for text in texts for c in text], dtype=np.int64), lengths


def megatron_document(value: str | list[str], append_eod: bool) -> tuple[list[int], list[int]]:
    """Encoder.encode of preprocess_data.py, line by line, on CharTokenizer: (ids, sentence_lens)."""
    doc_ids, sentence_lens = [], []
    for sentence in value if isinstance(value, list) else [value]:
        sentence_ids = [ord(c) for c in sentence]
        if len(sentence_ids) > 0:
            doc_ids.extend(sentence_ids)
            sentence_lens.append(len(sentence_ids))
    if len(doc_ids) > 0 and append_eod:
        doc_ids.append(CharTokenizer.eod)
        sentence_lens[-1] += 1
    return doc_ids, sentence_lens


TEXTS = st.text("ab", max_size=3)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.one_of(TEXTS, st.lists(TEXTS, max_size=4)), max_size=12), st.booleans(), st.data())
def test_any_documents_are_written_as_megatrons_builder_writes_them(documents, append_eod, data):
    """Chunks parsed and encoded as the workers do, written in two parts, against Megatron's
    add_document(doc_ids, sentence_lens) per document."""
    lines = [json.dumps({"text": d}).encode() + b"\n" for d in documents]
    cut = data.draw(st.integers(0, len(lines)))
    eod = CharTokenizer.eod if append_eod else None
    state = WorkerState(CharTokenizer(), ("text",), eod, np.dtype(np.uint16), False)
    with tempfile.TemporaryDirectory() as directory, pytest.MonkeyPatch.context() as patch:
        patch.setattr(prepare_module, "_STATE", state)
        with IndexedDatasetWriter(f"{directory}/got", np.uint16) as writer:
            for first, part in ((1, lines[:cut]), (cut + 1, lines[cut:])):
                result = prepare_module.encode_chunk(Chunk("in.jsonl", first, b"".join(part), 0))
                assert result.error is None and result.documents == len(part)
                writer.add_documents(result.tokens[0], result.lengths[0], result.sentences[0])
        with IndexedDatasetWriter(f"{directory}/want", np.uint16) as reference:
            for document in documents:
                ids, lengths = megatron_document(document, append_eod)
                reference.add_document(np.array(ids, dtype=np.int64), lengths)
        for suffix in (".idx", ".bin"):
            assert (
                Path(f"{directory}/got{suffix}").read_bytes()
                == Path(f"{directory}/want{suffix}").read_bytes()
            )
