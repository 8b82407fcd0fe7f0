"""The tokenizer record beside prepared data (gptrain.data.tokenizer_record): what it compares, how
it reads the type's spellings, and a user's file of its name."""

from __future__ import annotations

import json
from pathlib import Path

from gptrain.data.tokenizer_record import legacy_conflict, write_tokenizer_record


def test_legacy_gpt2_data_is_refused_to_a_run_of_another_type(tmp_path: Path) -> None:
    """Only a GPT-2 BPE run was compared, so legacy GPT-2 BPE data trained unchecked with a
    HuggingFaceTokenizer on GPT-2's tokenizer.json, which encodes a literal <|endoftext|> as its
    special token. A run of another type is compared as not legacy (the setting changes GPT-2 BPE
    only), so its flag in both steps of its own type's data stays accepted."""
    legacy, plain = str(tmp_path / "legacy"), str(tmp_path / "plain")
    write_tokenizer_record(legacy, "GPT2BPETokenizer", True)
    write_tokenizer_record(plain, "GPT2BPETokenizer", False)
    for flag in (False, True):
        text, advice = legacy_conflict([legacy], flag, "HuggingFaceTokenizer")
        assert text == (
            f"model.data.data_prefix: {legacy} was prepared with --legacy-tokenizer ({legacy}.tokenizer), "
            "and model.tokenizer.type is HuggingFaceTokenizer, which has no legacy encoding: a literal "
            "<|endoftext|> in text is encoded otherwise than in the data (generate, eval and export encode text)"
        )
        assert advice == (
            "set model.tokenizer.type=GPT2BPETokenizer and model.tokenizer.legacy=true to match the data, "
            "or exp_manager.allow_tokenizer_change=true to go on with this one"
        )
        assert legacy_conflict([plain], flag, "HuggingFaceTokenizer") is None
        assert legacy_conflict([plain], flag, "tiktoken") is None
    hf = str(tmp_path / "hf")
    write_tokenizer_record(hf, "HuggingFaceTokenizer", False)
    assert legacy_conflict([hf], True, "HuggingFaceTokenizer") is None
    assert legacy_conflict([legacy], True, "gpt2bpe") is None
    assert legacy_conflict([legacy], False, "gpt2bpe")[1].startswith("set model.tokenizer.legacy=true ")


def test_records_of_one_type_spelled_otherwise_merge_and_read_as_megatrons_name(tmp_path: Path) -> None:
    """The type was kept as the user spelled it and merges compared the records' JSON, so inputs
    prepared with --tokenizer-type gpt2bpe and GPT2BPETokenizer merged without a record (unchecked)."""
    from gptrain.data.tokenizer_record import merged_record, read_tokenizer_record

    a, b, old = (str(tmp_path / name) for name in ("a", "b", "old"))
    write_tokenizer_record(a, "GPT2BPETokenizer", True)
    write_tokenizer_record(b, "gpt2bpe", True)
    Path(f"{old}.tokenizer").write_text(json.dumps({"type": "gpt2", "legacy": True}))  # as written before
    expected = {"type": "GPT2BPETokenizer", "legacy": True}
    assert json.loads(Path(f"{b}.tokenizer").read_text()) == expected
    assert read_tokenizer_record(old) == expected
    assert merged_record([a, b, old]) == expected
    write_tokenizer_record(b, "llama2", False)
    write_tokenizer_record(a, "Llama2Tokenizer", False)
    assert merged_record([a, b]) == {"type": "Llama2Tokenizer", "legacy": False}
    write_tokenizer_record(a, "SentencePieceTokenizer", False)
    assert merged_record([a, b]) is None


def test_a_users_file_of_the_records_name_is_kept_and_the_first_name_still_read(
    tmp_path: Path, gpt2_files: tuple[str, str], capsys
) -> None:
    """Writing <prefix>.tokenizer replaced a user's own file of that name (a directory: a traceback),
    and a first-name record beside such a file was not read. Prepare and merge refuse it before
    writing anything (writing the record alone keeps it, with a warning), and the
    record is read under the first name where the new one is not a record."""
    from gptrain.cli import main
    from gptrain.data.tokenizer_record import read_tokenizer_record, record_path

    notes, shelf = tmp_path / "out_text_document.tokenizer", tmp_path / "shelf.tokenizer"
    notes.write_text("my notes\n")
    shelf.mkdir()
    write_tokenizer_record(str(tmp_path / "shelf"), "GPT2BPETokenizer", True)
    assert shelf.is_dir() and "shelf.tokenizer is not a tokenizer record" in capsys.readouterr().err
    source = tmp_path / "in.jsonl"
    source.write_text(json.dumps({"text": "a<|endoftext|>b"}) + "\n")
    vocab, merges = gpt2_files
    prefix = str(tmp_path / "out_text_document")
    Path(f"{prefix}.tokenizer.json").write_text(json.dumps({"type": "gpt2", "legacy": False}))  # stale
    argv = ["data", "prepare", "--input", str(source), "--output-prefix", str(tmp_path / "out")]
    flags = ["--workers", "1", "--vocab-file", vocab, "--merge-file", merges, "--legacy-tokenizer"]
    assert main([*argv, *flags]) == 2  # refused before any data is written
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        f"gptrain: error: --output-prefix {prefix}: {notes} is not a tokenizer record (a file of yours?), "
        "where the prepare writes the data's tokenizer record: move it, then prepare"
    )
    assert notes.read_text() == "my notes\n" and not Path(f"{prefix}.bin").exists()
    notes.unlink()
    assert main([*argv, *flags]) == 0
    assert read_tokenizer_record(prefix) == {
        "type": "GPT2BPETokenizer",
        "legacy": True,
        "append_eod": False,
    } | {
        "vocabulary": read_tokenizer_record(prefix)["vocabulary"]  # tests/data/test_tokenizer_fingerprint.py
    }
    assert not Path(f"{prefix}.tokenizer.json").exists()  # the stale first-name record replaced
    notes.write_text("my notes\n")
    Path(f"{prefix}.tokenizer.json").write_text(json.dumps({"type": "gpt2", "legacy": True}))
    assert record_path(prefix) == f"{prefix}.tokenizer.json"
    assert read_tokenizer_record(prefix) == {"type": "GPT2BPETokenizer", "legacy": True}
    merged = tmp_path / "merged"
    Path(f"{merged}.tokenizer").write_text("mine\n")
    assert main(["data", "merge", "--input", prefix, "--output-prefix", str(merged)]) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        f"gptrain: error: --output-prefix {merged}: {merged}.tokenizer is not a tokenizer record (a file "
        "of yours?), where the merge writes the data's tokenizer record: move it, then merge"
    )
    assert sorted(path.name for path in tmp_path.glob("merged*")) == ["merged.tokenizer"]
