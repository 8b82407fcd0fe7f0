"""model.tokenizer: NeMo's library and type spellings to one Megatron type, and its settings checked."""

from __future__ import annotations

from typing import Any

from gptrain.errors import ConfigError
from gptrain.utils.tokenizer_types import (
    MEGATRON_TYPES,
    NULL_TYPE,
    SENTENCEPIECE_TYPES,
    check_null_settings,
    hub_name_advice,
    is_tiktoken_vocabulary_file,
    megatron_tokenizer_type,
    tiktoken_settings_given,
)

TOKENIZER_LIBRARIES = ("megatron", "huggingface", "sentencepiece", "tiktoken")
"""NeMo's model.tokenizer.library values gptrain reads (get_nmt_tokenizer's, less byte-level, regex, tabular)."""


def tokenizer_type(tokenizer: Any) -> None:
    """The type's canonical spelling (any spelling data prepare takes). NeMo's `library: sentencepiece` reads `model` as a SentencePiece
    model and no type (a preset's GPT2BPETokenizer stays beside it): its ids alone, its eos ending
    documents, which is GPTSentencePieceTokenizer (one of Megatron's SentencePiece types is kept).
    `huggingface` with a type no Megatron type names is AutoTokenizer(type): the Hugging Face tokenizer
    at that path (as data prepare reads it; model is never read), and a Megatron type other than
    HuggingFaceTokenizer (a preset's GPT2BPETokenizer) or none is refused; `tiktoken` is TikTokenizer
    over vocab_file whatever type and model say (model only where vocab_file is null)."""
    library, named = str(tokenizer.library).lower(), megatron_tokenizer_type(tokenizer.type)
    if library not in TOKENIZER_LIBRARIES:
        raise ConfigError(
            f"model.tokenizer.library: '{tokenizer.library}' is not one of {', '.join(TOKENIZER_LIBRARIES)}"
            " (NeMo's byte-level, regex and tabular tokenizers are not implemented)"
        )
    kind = named or tokenizer.type
    if library == "megatron" and named is None and kind is not None:
        _refuse_hub_name(str(kind))
    if library == "sentencepiece" and kind not in SENTENCEPIECE_TYPES:
        kind = "GPTSentencePieceTokenizer"
    if library == "huggingface" and named is None:  # AutoTokenizer(type): NeMo never reads model here
        kind, tokenizer.model = "HuggingFaceTokenizer", _huggingface_type(tokenizer)
    elif (
        library == "huggingface" and named != "HuggingFaceTokenizer" and str(tokenizer.type).lower() != "gpt2"
    ):
        _huggingface_type(tokenizer)  # a Megatron type (a preset's GPT2BPETokenizer): no tokenizer's name
    if library == "tiktoken":  # NeMo's TiktokenTokenizer(vocab_file), whatever type and model say
        kind, tokenizer.model = "TikTokenizer", tokenizer.vocab_file or tokenizer.model
    if kind is None:
        raise ConfigError(
            f"model.tokenizer.type: null (model.tokenizer.library={tokenizer.library}); name the type, "
            "e.g. GPT2BPETokenizer (null is for library sentencepiece, as NeMo writes it)"
        )
    tokenizer.type = kind


def use_fast_notes(tokenizer: Any) -> list[str]:
    """`use_fast: false` (NeMo hands it to transformers' AutoTokenizer) where the slow tokenizer gives
    the fast one's ids, or is not read; HuggingFaceTokenizer's is checked against the tokenizer's
    class when it is built (gptrain.train.tokenizer_setup), which needs its files."""
    if tokenizer.use_fast is None or tokenizer.use_fast or tokenizer.type == "HuggingFaceTokenizer":
        return []
    if tokenizer.type == "GPT2BPETokenizer":
        return [
            "model.tokenizer.use_fast: false: transformers' slow GPT2Tokenizer gives the same ids as the fast "
            "one gptrain encodes with (the same byte-level BPE, split and <|endoftext|>)"
        ]
    return [
        f"model.tokenizer.use_fast: false: {tokenizer.type} does not read it (Hugging Face tokenizers only)"
    ]


def _refuse_hub_name(kind: str) -> None:
    """NeMo's library megatron hands a type it does not know to AutoTokenizer, which downloads it
    (`gpt2-medium`); gptrain says it does not, rather than only listing its types."""
    advice = hub_name_advice(kind, "pass model.tokenizer.library=huggingface model.tokenizer.type=DIR")
    if advice is not None:
        raise ConfigError(
            f"model.tokenizer.type: '{kind}' is not one of {', '.join(MEGATRON_TYPES)}; {advice}"
        )


def _huggingface_type(tokenizer: Any) -> str:
    """library huggingface's tokenizer: `type`, the path or hub name NeMo gives AutoTokenizer (HF's
    `gpt2`, or Megatron's HuggingFaceTokenizer over `model`, are taken before this)."""
    if tokenizer.type and megatron_tokenizer_type(tokenizer.type) is None:
        return str(tokenizer.type)
    raise ConfigError(
        f"model.tokenizer.type: {tokenizer.type} with model.tokenizer.library=huggingface, which reads type "
        "as the Hugging Face tokenizer's path or hub name (NeMo's AutoTokenizer(type), never model); "
        "give that path or name, or library megatron for a Megatron type"
    )


def check_tiktoken_settings(tokenizer: Any) -> None:
    """The TikTokenizer settings' types, checked on the login node (their relations, which Megatron
    asserts, where the vocabulary file is read: gptrain.data.tiktoken_file)."""
    _check_null_settings(tokenizer)
    size, count, specials = (
        tokenizer.vocab_size,
        tokenizer.tiktoken_num_special_tokens,
        tokenizer.special_tokens,
    )
    if size is not None and (isinstance(size, bool) or size < 1):
        raise ConfigError(f"model.tokenizer.vocab_size: must be at least 1, or null for 131072, got {size}")
    if isinstance(count, bool) or count < 0:
        raise ConfigError(f"model.tokenizer.tiktoken_num_special_tokens: must be 0 or more, got {count}")
    if specials is not None and not all(isinstance(token, str) and token for token in specials):
        raise ConfigError(
            f"model.tokenizer.special_tokens: expected a list of token names such as [<unk>, <s>, </s>, ...], "
            f"got {specials}"
        )
    _refuse_unread_tiktoken_settings(tokenizer)


def _refuse_unread_tiktoken_settings(tokenizer: Any) -> None:
    """vocab_size, tiktoken_pattern, tiktoken_num_special_tokens and special_tokens are read only
    with Megatron's tiktoken vocabulary file (Megatron reads its flags only for TikTokenizer); beside
    another tokenizer they were taken silently, beside an encoding name refused only as the job
    started: refused here, on the login node, naming the key."""
    if tokenizer.type == "TikTokenizer":
        if not tokenizer.model or is_tiktoken_vocabulary_file(str(tokenizer.model)):
            return
        reader = f"the tiktoken encoding {tokenizer.model!r}, which has its own split, vocabulary and special tokens"
    elif tokenizer.type == NULL_TYPE:
        reader = f"{NULL_TYPE}, which is model.tokenizer.vocab_size ids alone"
    else:
        reader = f"{tokenizer.type}, which has its own split and vocabulary"
    given = tiktoken_settings_given(
        tokenizer.tiktoken_pattern,
        None if tokenizer.type == NULL_TYPE else tokenizer.vocab_size,  # NullTokenizer's own
        tokenizer.tiktoken_num_special_tokens,
        tokenizer.special_tokens,
    )
    if given:
        raise ConfigError(
            f"{', '.join(given)}: read only by TikTokenizer with Megatron's tiktoken vocabulary file, not by "
            f"{reader}; drop it"
        )


def _check_null_settings(tokenizer: Any) -> None:
    """NullTokenizer needs vocab_size (Megatron asserts --vocab-size), and its ids are its alone:
    null_eod_id and null_pad_id beside another type were taken silently by no tokenizer. Their
    values are checked where it is built (gptrain.data.null_tokenizer), on the login node too."""
    if tokenizer.type != NULL_TYPE:
        named = [key for key in ("null_eod_id", "null_pad_id") if getattr(tokenizer, key) is not None]
        if named:
            keys = ", ".join(f"model.tokenizer.{key}" for key in named)
            raise ConfigError(f"{keys}: read only by {NULL_TYPE}, not {tokenizer.type}; drop it")
        return
    check_null_settings(tokenizer.vocab_size, tokenizer.null_eod_id, tokenizer.null_pad_id)
