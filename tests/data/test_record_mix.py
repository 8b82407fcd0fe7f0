"""A blend's datasets prepared with and without --append-eod, or split_special_tokens, said in one
line (gptrain.data.record_mix), from what data prepare records."""

from __future__ import annotations

import json
from pathlib import Path

from gptrain.data.null_tokenizer import NullOptions
from gptrain.data.prepare import PrepareConfig, prepare
from gptrain.data.record_mix import mixed_preparation_lines
from gptrain.data.tokenizer_record import read_tokenizer_record, write_tokenizer_record
from gptrain.data.tokenizers import TokenizerSpec


def prepared(tmp_path: Path, name: str, append_eod: bool) -> str:
    corpus = tmp_path / f"{name}.jsonl"
    corpus.write_text('{"text": "1 2 3"}\n{"text": "4 5"}\n')
    spec = TokenizerSpec("NullTokenizer", null=NullOptions(300))
    prepare(PrepareConfig([str(corpus)], str(tmp_path / name), spec, append_eod=append_eod))
    return str(tmp_path / f"{name}_text_document")


def test_data_prepare_records_whether_documents_end_with_eod(tmp_path):
    """Before: the record held the type, legacy and vocabulary; --append-eod was nowhere."""
    with_eod, without = prepared(tmp_path, "a", True), prepared(tmp_path, "b", False)
    assert read_tokenizer_record(with_eod)["append_eod"] is True
    assert read_tokenizer_record(without)["append_eod"] is False


def test_a_blend_with_and_without_eod_is_said_in_one_line(tmp_path):
    with_eod, without = prepared(tmp_path, "a", True), prepared(tmp_path, "b", False)
    lines = mixed_preparation_lines(["0.5", with_eod, "0.5", without + ".bin"], "model.data.data_prefix")
    assert lines == [
        f"gptrain: warning: model.data.data_prefix: {with_eod} was prepared with --append-eod, {without} "
        "without (their .tokenizer records): unless its text held that id (ids given to NullTokenizer), "
        f"{without}'s documents run on into each other with no end-of-document id between them; prepare "
        "both alike"
    ]
    assert mixed_preparation_lines([with_eod, with_eod], "x") == []
    assert mixed_preparation_lines([without], "x") == []  # alike: Megatron's default


def test_eod_mask_loss_over_data_without_eod_is_said(tmp_path):
    with_eod, without = prepared(tmp_path, "a", True), prepared(tmp_path, "b", False)
    assert mixed_preparation_lines([with_eod], "x", eod_mask_loss=True) == []
    (line,) = mixed_preparation_lines([with_eod, without], "x", eod_mask_loss=True)
    assert line == (
        f"gptrain: warning: x: {without} was prepared without --append-eod ({without}.tokenizer), and "
        "model.data.eod_mask_loss=true masks the end-of-document id: unless its text held that id (ids "
        "given to NullTokenizer), its documents end with none, so nothing is masked there and they run on "
        "into each other; prepare it with --append-eod"
    )


def test_records_without_the_key_say_nothing(tmp_path):
    old, new = str(tmp_path / "old"), prepared(tmp_path, "b", True)
    write_tokenizer_record(old, "NullTokenizer", False)  # as written before append_eod was recorded
    assert "append_eod" not in read_tokenizer_record(old)
    assert mixed_preparation_lines([old, new], "x", eod_mask_loss=True) == []
    assert mixed_preparation_lines([str(tmp_path / "megatrons")], "x", eod_mask_loss=True) == []


def hf_record(prefix: str, split: bool | None) -> None:
    vocabulary = {"files": ["/t/tokenizer.json"], "size": 9, "tokens": "a" * 64, "encodes": None, "eod": 8}
    if split is not None:
        vocabulary["split_special_tokens"] = split
    write_tokenizer_record(prefix, "HuggingFaceTokenizer", False, vocabulary)


def test_a_blend_with_and_without_split_special_tokens_is_said_in_one_line(tmp_path):
    """Before: a NullTokenizer run (or one with exp_manager.allow_tokenizer_change) trained such a
    blend without a word."""
    split, kept, old = (str(tmp_path / name) for name in ("split", "kept", "old"))
    hf_record(split, True)
    hf_record(kept, False)
    hf_record(old, None)  # written before the key: a special token's text read as its id
    for other in (kept, old):
        assert mixed_preparation_lines([split, other], "model.data.data_prefix") == [
            f"gptrain: warning: model.data.data_prefix: {split} was prepared with tokenizer_config.json's "
            f"split_special_tokens true, {other} with false (their .tokenizer records): a literal special "
            f"token's text is text in {split}'s ids, the special token's id in {other}'s; prepare both alike"
        ]
    assert mixed_preparation_lines([kept, old], "x") == []
    write_tokenizer_record(str(tmp_path / "gpt2"), "GPT2BPETokenizer", False, {"size": 9})
    assert mixed_preparation_lines([split, str(tmp_path / "gpt2")], "x") == []


def test_merge_says_inputs_with_and_without_eod_and_keeps_what_they_share(tmp_path, capsys):
    from gptrain.cli import main

    with_eod, without = prepared(tmp_path, "a", True), prepared(tmp_path, "b", False)
    capsys.readouterr()
    out = str(tmp_path / "merged")
    assert main(["data", "merge", "--input", with_eod, without, "--output-prefix", out]) == 0
    err = capsys.readouterr().err
    assert f"gptrain: warning: --input: {with_eod} was prepared with --append-eod, {without} without" in err
    assert read_tokenizer_record(out) == {"type": "NullTokenizer", "legacy": False}
    again = prepared(tmp_path, "c", True)
    assert main(["data", "merge", "--input", with_eod, again, "--output-prefix", out]) == 0
    assert "warning" not in capsys.readouterr().err
    assert read_tokenizer_record(out) == {"type": "NullTokenizer", "legacy": False, "append_eod": True}
    assert json.loads(Path(out + ".tokenizer").read_text())["append_eod"] is True


def test_documents_a_tokenizer_ends_with_eod_are_not_warned_of(tmp_path):
    """Before: data prepared without --append-eod by a tokenizer whose post-processor appends the
    eod ("$A </s>") was warned of as running on, and the advice (--append-eod) would double the eod.
    Now prepare records that the tokenizer appends it; a merge keeps the record."""
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import Whitespace
    from tokenizers.processors import TemplateProcessing

    from gptrain.data.indexed import IndexedDataset
    from gptrain.data.merge import merge_datasets

    vocab = {"a": 0, "b": 1, "<pad>": 2, "</s>": 3, "[UNK]": 4}
    tokenizer = Tokenizer(WordLevel(vocab, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = Whitespace()
    tokenizer.post_processor = TemplateProcessing(single="$A </s>", special_tokens=[("</s>", 3)])
    directory = tmp_path / "tok"
    directory.mkdir()
    tokenizer.save(str(directory / "tokenizer.json"))
    (directory / "tokenizer_config.json").write_text(json.dumps({"eos_token": "</s>"}))
    corpus = tmp_path / "c.jsonl"
    corpus.write_text('{"text": "a b a"}\n{"text": "b b"}\n')
    spec = TokenizerSpec("HuggingFaceTokenizer", model=str(directory))
    prepare(PrepareConfig([str(corpus)], str(tmp_path / "pp"), spec))
    prepare(PrepareConfig([str(corpus)], str(tmp_path / "pp2"), spec))
    without = str(tmp_path / "pp_text_document")
    dataset = IndexedDataset(without)
    assert [dataset[i].tolist() for i in range(len(dataset))] == [[0, 1, 0, 3], [1, 1, 3]]
    assert read_tokenizer_record(without)["tokenizer_appends_eod"] is True
    assert mixed_preparation_lines([without], "x", eod_mask_loss=True) == []
    merged = str(tmp_path / "merged")
    merge_datasets([without, str(tmp_path / "pp2_text_document")], merged)
    assert read_tokenizer_record(merged)["tokenizer_appends_eod"] is True
    assert mixed_preparation_lines([merged], "x", eod_mask_loss=True) == []
    nulls = prepared(tmp_path, "n", True)  # with --append-eod: alike, no line
    assert "tokenizer_appends_eod" not in read_tokenizer_record(nulls)
    assert mixed_preparation_lines([nulls, without], "x") == []
