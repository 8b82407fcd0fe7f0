"""Megatron's tokenizer types and every spelling gptrain takes for them: the one table that the
training config (model.tokenizer.type) and data prepare (--tokenizer-type) both read, so a spelling
one accepts the other accepts too. Here rather than in config or data because both import it, and
the `data` parsers stay light (no omegaconf, which importing gptrain.config brings)."""

from __future__ import annotations

import os
import re

from gptrain.errors import ConfigError
from gptrain.utils.paths import look_up

SENTENCEPIECE_TYPES = ("GPTSentencePieceTokenizer", "Llama2Tokenizer", "SentencePieceTokenizer")
"""Megatron's types of a SentencePiece tokenizer.model (how each encodes: gptrain.data.tokenizers)."""
NULL_TYPE = "NullTokenizer"
"""Megatron's type of a vocabulary of --vocab-size ids with no files, for data already tokenized."""
MEGATRON_TYPES = ("GPT2BPETokenizer", "HuggingFaceTokenizer", "TikTokenizer", *SENTENCEPIECE_TYPES, NULL_TYPE)

NO_PAD = -1
"""NullTokenizer's padding id where none is given, as Megatron's: no token has it."""

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
    "nulltokenizer": NULL_TYPE,  # not `null`, which YAML and overrides read as no type
}
"""A spelling with case, `_`, `-` and other punctuation removed -> Megatron's type name."""


def megatron_tokenizer_type(spelling: object) -> str | None:
    """Megatron's name for a tokenizer type however it is written (any case, `_` and `-` ignored:
    `Tik_Tokenizer`, `gpt2-bpe`, `llama2`), or None for a type gptrain does not know."""
    return SPELLINGS.get(re.sub(r"[^a-z0-9]", "", str(spelling).lower()))


TIKTOKEN_DEFAULT_NUM_SPECIAL_TOKENS = 1000
"""Megatron's --tiktoken-num-special-tokens default."""
# each TikTokenizer setting as the config and Megatron's flags name it, for the messages
TIKTOKEN_PATTERN_KEY = "model.tokenizer.tiktoken_pattern (--tiktoken-pattern)"
TIKTOKEN_SIZE_KEY = "model.tokenizer.vocab_size (--vocab-size)"
TIKTOKEN_COUNT_KEY = "model.tokenizer.tiktoken_num_special_tokens (--tiktoken-num-special-tokens)"
TIKTOKEN_SPECIALS_KEY = "model.tokenizer.special_tokens (--tokenizer-special-tokens)"


def names_a_file(model: str) -> bool:
    """Whether a tokenizer model is a path rather than a name: tiktoken's encoding names hold no
    directory or extension, so a missing `data/tokenizer.json` is a wrong path, not an unknown
    encoding."""
    return os.sep in model or "/" in model or os.path.splitext(model)[1] != ""


def is_tiktoken_vocabulary_file(model: str) -> bool:
    """Whether a TikTokenizer's model names a file (Megatron's vocabulary) rather than one of
    tiktoken's encoding names."""
    return names_a_file(model) or os.path.isfile(model)


def tiktoken_settings_given(
    pattern: str | None, vocab_size: int | None, num_special_tokens: int | None, special_tokens: object
) -> list[str]:
    """The TikTokenizer settings that differ from Megatron's defaults, by name: read only with
    Megatron's vocabulary file, so the config refuses them beside anything else (here, below both
    config and data, which each check them)."""
    count = num_special_tokens not in (None, TIKTOKEN_DEFAULT_NUM_SPECIAL_TOKENS)
    given = (pattern, vocab_size, count, special_tokens is not None)
    names = (TIKTOKEN_PATTERN_KEY, TIKTOKEN_SIZE_KEY, TIKTOKEN_COUNT_KEY, TIKTOKEN_SPECIALS_KEY)
    return [name for name, value in zip(names, given, strict=True) if value]


# a Hugging Face hub repository id: `gpt2-medium` or `owner/name` (letters, digits, `-`, `_`, `.`)
_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*(/[A-Za-z0-9][\w.-]*)?")
_TOKENIZER_FILE_SUFFIXES = (".json", ".model", ".txt", ".tiktoken", ".bpe", ".vocab")


def hub_name_advice(value: object, pass_as: str = "pass the local directory DIR") -> str | None:
    """What to do when a tokenizer's path is missing and reads as a Hugging Face hub name
    (`gpt2-medium`, `meta-llama/Llama-2-7b-hf`), which NeMo's AutoTokenizer downloads: gptrain
    never downloads, so the user needs the local copy; None for anything else (a missing file's
    own message says enough). Only where the path is missing: one the file system cannot look up (a
    link loop, a directory above it this user may not search) is a local path, whose own message
    says why. An unset value (None, whose text reads as a name) is none."""
    text = str(value)
    if value is None or not _HUB_ID.fullmatch(text) or text.endswith(_TOKENIZER_FILE_SUFFIXES):
        return None
    if look_up(text).kind != "missing":
        return None
    return (
        f"gptrain does not download tokenizers from the Hugging Face hub: if {text!r} is a hub name, "
        f"download it (huggingface-cli download {text} --local-dir DIR) and {pass_as}"
    )


def check_null_settings(vocab_size: object, eod_id: object, pad_id: object) -> None:
    """NullTokenizer's vocab_size (required, as Megatron asserts --vocab-size), null_eod_id (an id of
    it) and null_pad_id (-1 or more), named by their keys: here, below config and data, which both
    check them (the login node before the queue, data and training where it is built)."""
    if vocab_size is None:
        raise ConfigError(
            "NullTokenizer needs its vocabulary size: model.tokenizer.vocab_size (the --vocab-size of "
            "Megatron and of the data commands), more than the data's largest token id"
        )
    if isinstance(vocab_size, bool) or not isinstance(vocab_size, int) or vocab_size < 1:
        raise ConfigError(
            f"model.tokenizer.vocab_size: must be a whole number of at least 1, got {vocab_size!r}"
        )
    last = vocab_size - 1
    if eod_id is not None and (
        isinstance(eod_id, bool) or not isinstance(eod_id, int) or not 0 <= eod_id <= last
    ):
        raise ConfigError(
            f"model.tokenizer.null_eod_id: {eod_id!r} is not an id of the vocabulary (0 to {last}); "
            f"give one, or none for {last}, the last, as Megatron's"
        )
    if pad_id is not None and (isinstance(pad_id, bool) or not isinstance(pad_id, int) or pad_id < NO_PAD):
        raise ConfigError(
            f"model.tokenizer.null_pad_id: {pad_id!r}: give the id whose labels stay out of the loss, or -1 "
            "(or none) for no padding"
        )
