"""Data prepared with one of Megatron's SentencePiece wrappers and a run with another on the same
tokenizer.model: refused (the ids differ), in words that name what differs. Llama2Tokenizer against
GPTSentencePieceTokenizer was "other merges, pre-tokenizer or normalizer", where the one difference
is the bos Llama2Tokenizer puts first (the checkpoint check already said "or a bos put first")."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gptrain.cli import main
from gptrain.config import load_training_config
from gptrain.errors import ConfigError

pytest.importorskip("sentencepiece")


def _prepare(tmp_path: Path, model: str, kind: str) -> str:
    source = tmp_path / "in.jsonl"
    source.write_text(json.dumps({"text": "Hello world, the data."}) + "\n")
    prefix = tmp_path / kind
    argv = ["data", "prepare", "--input", str(source), "--output-prefix", str(prefix), "--workers", "1"]
    assert main([*argv, "--tokenizer-type", kind, "--tokenizer-model", model, "--append-eod"]) == 0
    return f"{prefix}_text_document"


def _refusal(prefix: str, kind: str, model: str) -> str:
    from gptrain.train.tokenizer_setup import build_tokenizer, check_data_tokenizer

    overrides = [
        f"model.data.data_prefix=[1.0,{prefix}]",
        f"model.tokenizer.type={kind}",
        "model.tokenizer.library=megatron",
        f"model.tokenizer.model={model}",
        "model.tokenizer.vocab_file=null",
        "model.tokenizer.merge_file=null",
    ]
    cfg = load_training_config("gpt3/126m", overrides, report_ignored=False)
    with pytest.raises(ConfigError) as error:
        check_data_tokenizer(cfg, tokenizer=build_tokenizer(cfg))
    return str(error.value)


@pytest.mark.parametrize(
    ("data", "run"),
    [("Llama2Tokenizer", "GPTSentencePieceTokenizer"), ("GPTSentencePieceTokenizer", "Llama2Tokenizer")],
)
def test_the_same_model_through_another_wrapper_names_the_bos(tmp_path, sp_model, capsys, data, run):
    prefix = _prepare(tmp_path, sp_model, data)
    capsys.readouterr()
    message = _refusal(prefix, run, sp_model)
    model = str(Path(sp_model).resolve())
    assert f"was tokenized with {data} {model} " in message and f"is {run} {model}: " in message
    assert (
        ": the same tokens, but text is encoded otherwise (other merges, pre-tokenizer or normalizer, or a bos "
        f"put first; the same files, read as {data} by the data and as {run} by the run): generate, eval and "
        "export would encode text otherwise than the data; "
    ) in message, message
    assert f"or set model.tokenizer.type={data}, as the data was tokenized, or exp_manager" in message
    assert "point model.tokenizer.model at the files" not in message  # it names them already


def test_megatrons_sentencepiece_vocabulary_against_the_models_names_both_types(tmp_path, sp_model):
    """SentencePieceTokenizer adds <CLS> <SEP> <EOD> <MASK> <PAD> to the model's pieces: "another
    vocabulary" is true, but the same file was named on both sides, with nothing said of the types."""
    prefix = _prepare(tmp_path, sp_model, "SentencePieceTokenizer")
    message = _refusal(prefix, "GPTSentencePieceTokenizer", sp_model)
    assert (
        ": 250 tokens, not 255 (the same files, read as SentencePieceTokenizer by the data and as "
        "GPTSentencePieceTokenizer by the run): another vocabulary, so the data's ids would mean other tokens; "
    ) in message, message
