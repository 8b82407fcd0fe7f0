"""tokenizer_config.json's split_special_tokens (read by gptrain's HuggingFaceTokenizer from f34b196
on, as AutoTokenizer reads it): a run or data made before, when gptrain read a literal special
token's text as its id, is neither refused nor silently changed."""

from __future__ import annotations

import json
from pathlib import Path

from tokenizers import Tokenizer
from tokenizers.models import WordLevel
from tokenizers.pre_tokenizers import Whitespace

from gptrain.data.tokenizer_identity import TokenizerCheck, record
from gptrain.data.tokenizer_loaders import load_huggingface

WORDS = ["hello", "world", "after", "the", "end"]


def split_dir(path: Path, split: bool = True) -> str:
    """A word-level tokenizer.json whose <|endoftext|> is an added special token, with a
    tokenizer_config.json saying split_special_tokens (as gptrain's legacy GPT-2 export writes)."""
    vocab = {word: i for i, word in enumerate(WORDS)}
    tokenizer = Tokenizer(WordLevel(vocab, unk_token=WORDS[0]))
    tokenizer.pre_tokenizer = Whitespace()
    tokenizer.add_special_tokens(["<|endoftext|>"])
    path.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(path / "tokenizer.json"))
    config = {"eos_token": "<|endoftext|>", "split_special_tokens": split}
    (path / "tokenizer_config.json").write_text(json.dumps(config))
    return str(path)


def record_before_the_key(model: str) -> dict:
    """The checkpoint record gptrain wrote before f34b196: special tokens' text read as their ids,
    no split_special_tokens key."""
    tokenizer = load_huggingface(model)
    tokenizer.tokenizer.encode_special_tokens = False
    saved = record(tokenizer, "HuggingFaceTokenizer", model)
    del saved["split_special_tokens"]
    return saved


def test_a_checkpoint_recorded_before_split_special_tokens_resumes_with_a_note(tmp_path):
    model = split_dir(tmp_path / "tok")
    saved = record_before_the_key(model)
    live = TokenizerCheck.of(load_huggingface(model), "HuggingFaceTokenizer", model)
    assert live.record["split_special_tokens"] is True
    assert live.record["encodes"] != saved["encodes"]  # the probe's <|endoftext|> is text now
    error, note = live.check(saved, "checkpoint ckpt/step_2", "this run's model.tokenizer", "fix it")
    assert error is None
    assert "split_special_tokens" in note and "checkpoint ckpt/step_2" in note
    assert "\n" not in note


def test_a_recorded_split_special_tokens_that_differs_is_refused_by_name(tmp_path):
    model = split_dir(tmp_path / "tok")
    saved = record_before_the_key(model) | {"split_special_tokens": False}
    live = TokenizerCheck.of(load_huggingface(model), "HuggingFaceTokenizer", model)
    error, note = live.check(saved, "checkpoint ckpt/step_2", "this run's model.tokenizer", "fix it")
    assert note is None
    assert "split_special_tokens is true, not false" in error
    assert "encode text otherwise" in error


def test_a_record_before_the_key_of_other_tokens_is_still_refused(tmp_path):
    model = split_dir(tmp_path / "tok")
    saved = record_before_the_key(model) | {"tokens": "0" * 64}
    live = TokenizerCheck.of(load_huggingface(model), "HuggingFaceTokenizer", model)
    error, note = live.check(saved, "checkpoint ckpt/step_2", "this run's model.tokenizer", "fix it")
    assert note is None and "other tokens" in error


def _prepare(tmp_path: Path, name: str, model: str) -> str:
    from gptrain.cli import main

    source = tmp_path / f"{name}.jsonl"
    source.write_text(json.dumps({"text": "hello <|endoftext|> world"}) + "\n")
    argv = [
        "data",
        "prepare",
        "--input",
        str(source),
        "--output-prefix",
        str(tmp_path / name),
        "--workers",
        "1",
    ]
    assert main([*argv, "--tokenizer-type", "HuggingFaceTokenizer", "--tokenizer-model", model]) == 0
    return f"{tmp_path / name}_text_document"


def test_a_merge_of_data_prepared_before_and_after_split_special_tokens_is_refused(tmp_path, capsys):
    """Data prepared before f34b196 holds <|endoftext|>'s id where the text had it, data prepared now
    the text's pieces: merged, it holds that text encoded two ways."""
    from gptrain.cli import main

    model = split_dir(tmp_path / "tok")
    old, new = _prepare(tmp_path, "old", model), _prepare(tmp_path, "new", model)
    record = json.loads(Path(f"{old}.tokenizer").read_text())
    assert record["vocabulary"].pop("split_special_tokens") is True
    Path(f"{old}.tokenizer").write_text(json.dumps(record))  # as gptrain wrote it before
    capsys.readouterr()
    assert main(["data", "merge", "--input", old, new, "--output-prefix", str(tmp_path / "m")]) == 2
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert "split_special_tokens true, not false" in error and f"--input {new}" in error
    assert not list(tmp_path.glob("m_*")) and not list(tmp_path.glob("m.*"))
    again = _prepare(tmp_path, "again", model)
    assert main(["data", "merge", "--input", new, again, "--output-prefix", str(tmp_path / "m")]) == 0
