"""One table of tokenizer type spellings for the training config and data prepare: `Tik_Tokenizer`
was taken by data prepare (case, `_` and `-` ignored) and refused by model.tokenizer.type (case only)."""

from __future__ import annotations

import argparse

import pytest

from gptrain.config import load_training_config
from gptrain.data.tokenizer_args import canonical_type, tokenizer_type
from gptrain.errors import ConfigError
from gptrain.utils.tokenizer_types import MEGATRON_TYPES, SPELLINGS

WRITTEN = {
    "Tik_Tokenizer": "TikTokenizer",
    "tik-token": "TikTokenizer",
    "GPT2-BPE": "GPT2BPETokenizer",
    "gpt2": "GPT2BPETokenizer",
    "HF": "HuggingFaceTokenizer",
    "AutoTokenizer": "HuggingFaceTokenizer",
    "Hugging_Face_Tokenizer": "HuggingFaceTokenizer",
    "llama2": "Llama2Tokenizer",
    "LLAMA2-TOKENIZER": "Llama2Tokenizer",
    "gpt_sentence_piece": "GPTSentencePieceTokenizer",
    "sentence-piece-tokenizer": "SentencePieceTokenizer",
}
"""Spellings as users write them -> Megatron's type."""
LOADER_KIND = {
    "GPT2BPETokenizer": "gpt2",
    "HuggingFaceTokenizer": "huggingface",
    "TikTokenizer": "tiktoken",
    "GPTSentencePieceTokenizer": "gptsentencepiece",
    "Llama2Tokenizer": "llama2",
    "SentencePieceTokenizer": "sentencepiece",
    "NullTokenizer": "null",
}
"""The loader gptrain.data.tokenizers builds for each type."""


def every_spelling() -> list[tuple[str, str]]:
    """Each table entry as written there and upper-cased with a `_` and a `-` in it, Megatron's own
    names, and WRITTEN."""
    decorated = [(f"{k[:2].upper()}_{k[2:4]}-{k[4:]}", v) for k, v in SPELLINGS.items()]
    return [*SPELLINGS.items(), *decorated, *((t, t) for t in MEGATRON_TYPES), *WRITTEN.items()]


@pytest.mark.parametrize(("spelling", "megatron_type"), every_spelling())
def test_every_spelling_is_the_same_type_in_the_config_and_in_data_prepare(spelling, megatron_type):
    size = ["model.tokenizer.vocab_size=64"] if megatron_type == "NullTokenizer" else []  # its one setting
    cfg = load_training_config(
        "gpt3/126m", ["model.data.mock_dataset=true", f"model.tokenizer.type={spelling}", *size]
    )
    assert cfg.model.tokenizer.type == megatron_type
    assert canonical_type(spelling) == LOADER_KIND[megatron_type]


@pytest.mark.parametrize("spelling", ["bert", "sentencepiece", "gpt3"])
def test_an_unknown_spelling_is_refused_by_both(spelling):
    with pytest.raises(
        ConfigError, match=f"model.tokenizer.type: '{spelling}' is not one of GPT2BPETokenizer"
    ):
        load_training_config(
            "gpt3/126m", ["model.data.mock_dataset=true", f"model.tokenizer.type={spelling}"]
        )
    with pytest.raises(ConfigError, match=f"unknown --tokenizer-type '{spelling}'"):
        canonical_type(spelling)


@pytest.mark.parametrize(
    ("spelling", "megatron_type"),
    [
        ("llama2", "Llama2Tokenizer"),
        ("Llama2_Tokenizer", "Llama2Tokenizer"),
        ("sentence-piece-tokenizer", "SentencePieceTokenizer"),
        ("gpt2", "GPTSentencePieceTokenizer"),
        (None, "GPTSentencePieceTokenizer"),
    ],
)
def test_library_sentencepiece_keeps_a_sentencepiece_type_by_any_spelling_in_both(
    spelling, megatron_type, sp_model
):
    """NeMo's library sentencepiece keeps one of Megatron's SentencePiece types, else encodes as
    GPTSentencePieceTokenizer; `llama2` there was GPTSentencePieceTokenizer to both the config and
    data prepare (data prepare kept only the exact names), where Llama2Tokenizer was asked for."""
    overrides = ["model.data.mock_dataset=true", "model.tokenizer.library=sentencepiece"]
    overrides += [
        f"model.tokenizer.type={'null' if spelling is None else spelling}",
        f"model.tokenizer.model={sp_model}",
    ]
    assert load_training_config("gpt3/126m", overrides).model.tokenizer.type == megatron_type
    args = argparse.Namespace(
        tokenizer_library="sentencepiece",
        tokenizer_type=spelling,
        tokenizer_model=sp_model,
        vocab_file=None,
        merge_file=None,
    )
    assert tokenizer_type(args) == megatron_type
