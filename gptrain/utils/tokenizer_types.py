"""Megatron's tokenizer types and every spelling gptrain takes for them: the one table that the
training config (model.tokenizer.type) and data prepare (--tokenizer-type) both read, so a spelling
one accepts the other accepts too. Here rather than in config or data because both import it, and
the `data` parsers stay light (no omegaconf, which importing gptrain.config brings)."""

from __future__ import annotations

import re

SENTENCEPIECE_TYPES = ("GPTSentencePieceTokenizer", "Llama2Tokenizer", "SentencePieceTokenizer")
"""Megatron's types of a SentencePiece tokenizer.model (how each encodes: gptrain.data.tokenizers)."""
MEGATRON_TYPES = ("GPT2BPETokenizer", "HuggingFaceTokenizer", "TikTokenizer", *SENTENCEPIECE_TYPES)

SPELLINGS = {
    "gpt2bpetokenizer": "GPT2BPETokenizer",
    "gpt2bpe": "GPT2BPETokenizer",
    "gpt2": "GPT2BPETokenizer",
    "huggingfacetokenizer": "HuggingFaceTokenizer",
    "huggingface": "HuggingFaceTokenizer",
    "hf": "HuggingFaceTokenizer",
    "autotokenizer": "HuggingFaceTokenizer",
    "tiktokenizer": "TikTokenizer",
    "tiktoken": "TikTokenizer",
    "gptsentencepiecetokenizer": "GPTSentencePieceTokenizer",
    "gptsentencepiece": "GPTSentencePieceTokenizer",
    "llama2tokenizer": "Llama2Tokenizer",
    "llama2": "Llama2Tokenizer",
    "sentencepiecetokenizer": "SentencePieceTokenizer",
}
"""A spelling with case, `_`, `-` and other punctuation removed -> Megatron's type name."""


def megatron_tokenizer_type(spelling: object) -> str | None:
    """Megatron's name for a tokenizer type however it is written (any case, `_` and `-` ignored:
    `Tik_Tokenizer`, `gpt2-bpe`, `llama2`), or None for a type gptrain does not know."""
    return SPELLINGS.get(re.sub(r"[^a-z0-9]", "", str(spelling).lower()))
