"""The Megatron tokenizer flags shared by the `data` subcommands (light: no tokenizer import here)."""

from __future__ import annotations

import argparse
import os
from typing import Any

from gptrain.errors import ConfigError
from gptrain.utils.tokenizer_types import SENTENCEPIECE_TYPES, megatron_tokenizer_type, names_a_file

KINDS = {
    "GPT2BPETokenizer": "gpt2",
    "HuggingFaceTokenizer": "huggingface",
    "TikTokenizer": "tiktoken",
    "SentencePieceTokenizer": "sentencepiece",
    "GPTSentencePieceTokenizer": "gptsentencepiece",
    "Llama2Tokenizer": "llama2",
}
"""Megatron's tokenizer type -> gptrain's kind (the loader in gptrain.data.tokenizers)."""


def canonical_type(tokenizer_type: str) -> str:
    """gptrain's kind for a tokenizer type by any spelling the training config takes too
    (gptrain.utils.tokenizer_types), shared by the launcher's checks (light: no tokenizer import)."""
    megatron_type = megatron_tokenizer_type(tokenizer_type)
    if megatron_type is None:
        raise ConfigError(
            f"unknown --tokenizer-type {tokenizer_type!r}: use GPT2BPETokenizer, HuggingFaceTokenizer, "
            "TikTokenizer, GPTSentencePieceTokenizer, Llama2Tokenizer or SentencePieceTokenizer"
        )
    return KINDS[megatron_type]


def add_tokenizer_args(
    parser: argparse.ArgumentParser, title: str = "tokenizer (Megatron flags)", vocab_size: bool = True
) -> None:
    """The tokenizer flags; `vocab_size` False where the command has its own --vocab-size (data
    sample's mock vocabulary, which a TikTokenizer vocabulary file then reads as its own)."""
    group = parser.add_argument_group(title)
    group.add_argument(
        "--tokenizer-type",
        help="GPT2BPETokenizer (--vocab-file, --merge-file), HuggingFaceTokenizer (--tokenizer-model "
        "tokenizer.json), TikTokenizer (--tokenizer-model Megatron's tiktoken vocabulary .json, or an "
        "encoding name, e.g. cl100k_base), or "
        "GPTSentencePieceTokenizer, Llama2Tokenizer, SentencePieceTokenizer (--tokenizer-model "
        "tokenizer.model); default: implied by the other flags",
    )
    # --vocab: older preprocess_data.py scripts' abbreviation, which --vocab-size made ambiguous
    group.add_argument("--vocab-file", "--vocab", dest="vocab_file", help="GPT-2 vocab.json")
    group.add_argument("--merge-file", help="GPT-2 merges.txt")
    group.add_argument(
        "--tokenizer-model",
        help="tokenizer.json (or its directory), a SentencePiece tokenizer.model, or for TikTokenizer "
        "Megatron's tiktoken vocabulary .json or a tiktoken encoding name",
    )
    group.add_argument(
        "--tiktoken-pattern",
        choices=("v1", "v2"),
        help="TikTokenizer vocabulary file: the split (default v2)",
    )
    if vocab_size:
        group.add_argument(
            "--vocab-size",
            type=int,
            help="TikTokenizer vocabulary file: ids, special tokens included (default 131072, Megatron's)",
        )
    group.add_argument(
        "--tiktoken-num-special-tokens",
        type=int,
        default=1000,
        help="TikTokenizer vocabulary file: special token ids before the file's ranks (default 1000)",
    )
    group.add_argument(
        "--tokenizer-special-tokens",
        "--tiktoken-special-tokens",  # Megatron's older name
        nargs="+",
        dest="tokenizer_special_tokens",
        help="TikTokenizer vocabulary file: ids 0, 1, ...; must hold <unk> <s> </s> <mask> <pad> <cls> <sep>",
    )
    group.add_argument(
        "--tokenizer-library",
        choices=("megatron", "huggingface", "sentencepiece"),
        help="NeMo's preprocessing flag: megatron (--tokenizer-type is Megatron's), huggingface "
        "(--tokenizer-type, or --tokenizer-model, is a tokenizer.json or its directory) or "
        "sentencepiece (--tokenizer-model tokenizer.model, encoded as GPTSentencePieceTokenizer unless --tokenizer-type names another SentencePiece type)",
    )


def tokenizer_type(args: argparse.Namespace) -> str | None:
    """The given --tokenizer-type, else what the other flags imply (vocab file: GPT-2 BPE;
    an existing --tokenizer-model path: Hugging Face; any other model name: tiktoken). NeMo's
    `--tokenizer-library huggingface --tokenizer-type PATH` is the Hugging Face tokenizer at PATH;
    NeMo's `--tokenizer-library sentencepiece` ignores --tokenizer-type and encodes the model's ids
    alone, ending a document with its eos: GPTSentencePieceTokenizer; one of Megatron's SentencePiece
    types given beside it, by any spelling, is kept, as the training config keeps it (data and model
    agree)."""
    if getattr(args, "tokenizer_library", None) == "sentencepiece":
        named = megatron_tokenizer_type(args.tokenizer_type)
        return named if named in SENTENCEPIECE_TYPES else "GPTSentencePieceTokenizer"
    if getattr(args, "tokenizer_library", None) == "huggingface":
        if not args.tokenizer_model and args.tokenizer_type not in (None, "HuggingFaceTokenizer"):
            args.tokenizer_model, args.tokenizer_type = args.tokenizer_type, None
        return "HuggingFaceTokenizer"
    if args.tokenizer_type:
        return args.tokenizer_type
    if args.vocab_file or args.merge_file:
        return "GPT2BPETokenizer"
    if args.tokenizer_model:
        if args.tokenizer_model.endswith(".model") and os.path.isfile(args.tokenizer_model):
            raise ConfigError(
                f"--tokenizer-model {args.tokenizer_model}: a SentencePiece model is encoded as the type "
                "says; pass --tokenizer-type GPTSentencePieceTokenizer, Llama2Tokenizer or SentencePieceTokenizer"
            )
        from gptrain.data.tokenizers import unreachable

        if os.path.exists(args.tokenizer_model) or unreachable(args.tokenizer_model):
            return "HuggingFaceTokenizer"  # its loader names a path it cannot look up
        if names_a_file(args.tokenizer_model):
            raise ConfigError(
                f"--tokenizer-model {args.tokenizer_model}: no such file or directory; give an existing "
                "tokenizer.json (or its directory), a SentencePiece tokenizer.model, or a tiktoken "
                "encoding name such as cl100k_base"
            )
        return "TikTokenizer"
    return None


def tokenizer_from_args(args: argparse.Namespace) -> Any | None:
    """The tokenizer the flags name, or None when no tokenizer flag was given."""
    kind = tokenizer_type(args)
    if kind is None:
        return None
    from gptrain.data.tokenizers import build_tokenizer

    return build_tokenizer(
        kind, args.vocab_file, args.merge_file, args.tokenizer_model, tiktoken_options(args)
    )


def tiktoken_options(args: argparse.Namespace) -> Any:
    """Megatron's TikTokenizer flags, read with its tiktoken vocabulary file."""
    from gptrain.data.tiktoken_file import TiktokenFileOptions

    specials = args.tokenizer_special_tokens
    return TiktokenFileOptions(
        args.tiktoken_pattern,
        args.vocab_size,
        args.tiktoken_num_special_tokens,
        tuple(specials) if specials is not None else None,
    )
