"""The Megatron tokenizer flags shared by the `data` subcommands (light: no tokenizer import here)."""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from gptrain.errors import ConfigError
from gptrain.utils.tokenizer_types import (
    SENTENCEPIECE_TYPES,
    hub_name_advice,
    megatron_tokenizer_type,
    names_a_file,
)

KINDS = {
    "GPT2BPETokenizer": "gpt2",
    "HuggingFaceTokenizer": "huggingface",
    "TikTokenizer": "tiktoken",
    "SentencePieceTokenizer": "sentencepiece",
    "GPTSentencePieceTokenizer": "gptsentencepiece",
    "Llama2Tokenizer": "llama2",
    "NullTokenizer": "null",
}
"""Megatron's tokenizer type -> gptrain's kind (the loader in gptrain.data.tokenizers)."""


def canonical_type(tokenizer_type: str) -> str:
    """gptrain's kind for a tokenizer type by any spelling the training config takes too
    (gptrain.utils.tokenizer_types), shared by the launcher's checks (light: no tokenizer import)."""
    megatron_type = megatron_tokenizer_type(tokenizer_type)
    if megatron_type is None:
        raise ConfigError(
            f"unknown --tokenizer-type {tokenizer_type!r}: use GPT2BPETokenizer, HuggingFaceTokenizer, "
            "TikTokenizer, GPTSentencePieceTokenizer, Llama2Tokenizer, SentencePieceTokenizer or NullTokenizer"
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
            help="TikTokenizer vocabulary file: ids, special tokens included (default 131072, Megatron's); "
            "NullTokenizer: its ids (required)",
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
    _add_megatron_tokenizer_switches(group)
    group.add_argument(
        "--tokenizer-library",
        choices=("megatron", "huggingface", "sentencepiece"),
        help="NeMo's preprocessing flag: megatron (--tokenizer-type is Megatron's), huggingface "
        "(--tokenizer-type, or --tokenizer-model, is a tokenizer.json or its directory) or "
        "sentencepiece (--tokenizer-model tokenizer.model, encoded as GPTSentencePieceTokenizer unless --tokenizer-type names another SentencePiece type)",
    )


def _add_megatron_tokenizer_switches(group: argparse._ArgumentGroup) -> None:
    """Megatron's tokenizer flags that gptrain's encoding already follows, or refuses by name
    (megatron_tokenizer_notes), so that preprocess_data.py command lines run unchanged."""
    group.add_argument(
        "--legacy-tokenizer",
        action="store_true",
        help="Megatron's older tokenizer system (its default up to core 0.14): GPT2BPETokenizer keeps a "
        "literal <|endoftext|> in the text as text (the default gives it the end-of-document id)",
    )
    for flag in (
        "--tokenizer-hf-use-fast",
        "--tokenizer-hf-no-use-fast",
        "--tokenizer-hf-include-special-tokens",
        "--tokenizer-hf-no-include-special-tokens",
        "--trust-remote-code",
    ):
        group.add_argument(flag, action="store_true", help=argparse.SUPPRESS)
    group.add_argument("--vocab-extra-ids", type=int, help=argparse.SUPPRESS)
    group.add_argument("--tokenizer-metadata", help=argparse.SUPPRESS)
    for flag in (*SENTENCEPIECE_SWITCHES, "--use-gigatoken"):  # Megatron core 0.16 to 0.19
        group.add_argument(flag, action="store_true", help=argparse.SUPPRESS)
    group.add_argument("--chat-template", help=argparse.SUPPRESS)
    group.add_argument("--padded-vocab-size", type=int, help=argparse.SUPPRESS)
    for flag in PAD_VOCAB_SWITCHES:
        group.add_argument(flag, action="store_true", help=argparse.SUPPRESS)
    for flag in NULL_TOKENIZER_IDS:
        group.add_argument(flag, type=int, help=argparse.SUPPRESS)


# Megatron's switches of its SentencePiece wrapper (core 0.16 on; the last two one flag, spelt twice)
SENTENCEPIECE_SWITCHES = (
    "--tokenizer-sentencepiece-legacy",
    "--no-tokenizer-sentencepiece-ignore-extra-whitespaces",
    "--disable-tokenizer-sentencepiece-ignore-extra-whitespaces",
)
# Megatron's switch (spelt twice) that leaves the model's vocabulary unpadded, read by training only
PAD_VOCAB_SWITCHES = ("--no-pad-vocab-size", "--disable-pad-vocab-size")
# Megatron's NullTokenizer ids (core 0.18): with NullTokenizer the end of document --append-eod adds
# (and the ids data inspect and sample show); beside another type accepted with a note
NULL_TOKENIZER_IDS = ("--null-tokenizer-eod-id", "--null-tokenizer-pad-id")
# Megatron's HF tokenizer switches -> why each changes nothing in gptrain's encoding
ALWAYS_FOLLOWED = {
    "--tokenizer-hf-use-fast": "gptrain encodes with the fast tokenizer, Megatron's default",
    "--tokenizer-hf-include-special-tokens": "gptrain adds a tokenizer's own special tokens to a text, "
    "Megatron's default",
}


def megatron_tokenizer_notes(args: argparse.Namespace, kind: str) -> list[str]:
    """Notes for Megatron's tokenizer flags given that change nothing for tokenizer type `kind`;
    a ConfigError for one whose ids gptrain does not reproduce."""
    if args.tokenizer_metadata is not None:
        raise ConfigError(
            f"--tokenizer-metadata {args.tokenizer_metadata}: Megatron's tokenizer metadata file chooses the "
            "tokenizer's library and class, which gptrain does not read; drop it and give the --tokenizer-type "
            "(and --tokenizer-model) it names"
        )
    named, kind = kind, canonical_type(kind)
    given = {flag: why for flag, why in ALWAYS_FOLLOWED.items() if _given(args, flag)}
    if args.tokenizer_special_tokens is not None and kind != "tiktoken":
        if not args.legacy_tokenizer:
            raise ConfigError(
                f"--tokenizer-special-tokens: Megatron adds them to {named}'s vocabulary, which gptrain does "
                "not; prepare with a tokenizer that holds them, or drop the flag"
            )
        given["--tokenizer-special-tokens"] = "Megatron's legacy tokenizers read it for TikTokenizer only"
    for flag in ("--tokenizer-hf-no-use-fast", "--tokenizer-hf-no-include-special-tokens"):
        if _given(args, flag):
            given[flag] = _hf_switch_effect(flag, kind, args.legacy_tokenizer, args.tokenizer_model)
    if args.trust_remote_code:
        given["--trust-remote-code"] = _remote_code_effect(args, kind)
    if args.vocab_extra_ids is not None:
        given["--vocab-extra-ids"] = _extra_ids_effect(args.vocab_extra_ids, kind)
    given.update(_newer_flag_effects(args, named, kind))
    if args.legacy_tokenizer and kind == "tiktoken":
        raise ConfigError(
            "--legacy-tokenizer: Megatron's legacy TikTokenizer kept a literal special token in the text as "
            "text and took other default special tokens; gptrain encodes as its current one: drop the flag "
            "(the ids differ only in texts holding a special token's name)"
        )
    return [f"note: {flag}: accepted, no effect: {why}" for flag, why in given.items()]


def _newer_flag_effects(args: argparse.Namespace, named: str, kind: str) -> dict[str, str]:
    """Why each tokenizer flag of Megatron core 0.16 to 0.19 given changes nothing for `kind` (the type
    `named` as given); a ConfigError for one whose ids gptrain does not reproduce."""
    given = {
        flag: _sentencepiece_switch_effect(flag, named, kind, args)
        for flag in SENTENCEPIECE_SWITCHES
        if _given(args, flag)
    }
    if args.use_gigatoken:
        given["--use-gigatoken"] = "Megatron's faster implementation of the same tokenizers"
    if args.chat_template is not None:
        given["--chat-template"] = (
            "Megatron formats conversations with it, not preprocess_data.py's documents"
        )
    for flag in NULL_TOKENIZER_IDS:
        if getattr(args, flag.lstrip("-").replace("-", "_")) is not None and kind != "null":
            given[flag] = "Megatron reads it for NullTokenizer only"
    for flag in ("--padded-vocab-size", *PAD_VOCAB_SWITCHES):
        if getattr(args, flag.lstrip("-").replace("-", "_")) not in (None, False):
            given[flag] = "the model's vocabulary rows, not the ids"
    return given


def _sentencepiece_switch_effect(flag: str, named: str, kind: str, args: argparse.Namespace) -> str:
    """Megatron's SentencePiece wrapper with `flag`: the legacy switch only splits out the special
    tokens it adds (refused beside a SentencePiece model); not ignoring extra whitespace keeps, as ids,
    the runs of spaces the model's normalizer drops (sentencepiece's default): refused where it does."""
    if args.legacy_tokenizer:
        return "Megatron's legacy tokenizers do not read it"
    if kind not in ("sentencepiece", "gptsentencepiece", "llama2"):
        return "Megatron reads it for SentencePiece tokenizers only"
    if flag == "--tokenizer-sentencepiece-legacy":
        return "without --tokenizer-special-tokens (refused here) Megatron's SentencePiece wrapper encodes the same ids"
    from gptrain.data.tokenizers import drops_runs_of_spaces

    model = args.tokenizer_model
    if drops_runs_of_spaces(named, model):
        raise ConfigError(
            f"{flag}: Megatron then keeps the runs of spaces {model} drops (its extra-whitespace workaround), "
            "whose ids gptrain does not reproduce; drop the flag"
        )
    return f"{model} keeps runs of spaces, so Megatron encodes the same ids"


def _given(args: argparse.Namespace, flag: str) -> bool:
    return bool(getattr(args, flag.lstrip("-").replace("-", "_")))


def _hf_switch_effect(flag: str, kind: str, legacy: bool, model: str | None) -> str:
    """Why --tokenizer-hf-no-use-fast / --tokenizer-hf-no-include-special-tokens change nothing, or
    a ConfigError where Megatron then encodes otherwise than gptrain."""
    if legacy:
        return "Megatron's legacy tokenizers do not read it"
    if kind not in ("gpt2", "huggingface"):
        return "Megatron reads it for HuggingFaceTokenizer and GPT2BPETokenizer only"
    if flag == "--tokenizer-hf-no-use-fast":
        return _slow_tokenizer_effect(flag, kind, model)
    if kind == "gpt2":
        return "GPT-2's tokenizer adds no special token to a text"
    raise ConfigError(
        f"{flag}: Megatron then adds none of the tokenizer's special tokens (a bos) to a text; gptrain adds "
        "them as transformers does, Megatron's default: drop the flag"
    )


def _slow_tokenizer_effect(flag: str, kind: str, model: str | None) -> str:
    """Megatron then encodes with transformers' slow class: the same ids for GPT-2 (and a tokenizer
    with no slow class); a ConfigError for another, whose ids may differ from its tokenizer.json's."""
    from gptrain.data.tokenizer_loaders import slow_class_that_differs

    if kind == "gpt2":
        return "transformers' slow GPT2Tokenizer gives the same ids as the fast one gptrain encodes with"
    if (slow := slow_class_that_differs(model or "")) is None:
        return "the class transformers then loads for this tokenizer.json gives the same ids as the fast one"
    raise ConfigError(
        f"{flag}: Megatron then encodes with transformers' slow {slow}, whose ids may differ from those of "
        "the tokenizer.json gptrain encodes with (as the fast one, Megatron's default); drop the flag"
    )


def _remote_code_effect(args: argparse.Namespace, kind: str) -> str:
    """--trust-remote-code changes nothing unless the tokenizer names code of its own (auto_map),
    which gptrain, reading its tokenizer.json, would not run."""
    if kind != "huggingface":
        return "this tokenizer has no code of its own to run"
    model = args.tokenizer_model or ""
    config = os.path.join(model if os.path.isdir(model) else os.path.dirname(model), "tokenizer_config.json")
    try:
        with open(config, encoding="utf-8") as file:
            auto_map = json.load(file).get("auto_map")
    except (OSError, ValueError, AttributeError):
        auto_map = None
    if auto_map:
        raise ConfigError(
            f"--trust-remote-code: {config} names the tokenizer's own Python code (auto_map), which Megatron "
            "runs with this flag; gptrain reads tokenizer.json and runs no such code, so the ids may differ: "
            "drop the flag only if that tokenizer.json encodes as the code does"
        )
    return "the tokenizer has no code of its own (no auto_map in its tokenizer_config.json)"


def _extra_ids_effect(count: int, kind: str) -> str:
    if count < 0:
        raise ConfigError(f"--vocab-extra-ids {count}: give 0 or more")
    if count and kind == "sentencepiece":
        raise ConfigError(
            f"--vocab-extra-ids {count}: Megatron's legacy SentencePieceTokenizer adds <extra_id_0> ... as "
            "tokens (T5's span masking), which gptrain does not; drop the flag"
        )
    return "Megatron reads it for BERT's and T5's tokenizers only"


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
        from gptrain.data.tokenizer_paths import unreachable

        if os.path.exists(args.tokenizer_model) or unreachable(args.tokenizer_model):
            return "HuggingFaceTokenizer"  # its loader names a path it cannot look up
        if names_a_file(args.tokenizer_model):
            hub = hub_name_advice(args.tokenizer_model)
            raise ConfigError(
                f"--tokenizer-model {args.tokenizer_model}: no such file or directory; "
                + (
                    hub
                    or "give an existing tokenizer.json (or its directory), a SentencePiece "
                    "tokenizer.model, or a tiktoken encoding name such as cl100k_base"
                )
            )
        return "TikTokenizer"
    return None


def tokenizer_from_args(args: argparse.Namespace) -> Any | None:
    """The tokenizer the flags name, or None when no tokenizer flag was given."""
    kind = tokenizer_type(args)
    if kind is None:
        return None
    from gptrain.data.tokenizers import build_tokenizer

    for note in megatron_tokenizer_notes(args, kind):
        print(note, file=sys.stderr)
    return build_tokenizer(
        kind,
        args.vocab_file,
        args.merge_file,
        args.tokenizer_model,
        tiktoken_options(args),
        args.legacy_tokenizer,
        null_options(args),
    )


def null_options(args: argparse.Namespace) -> Any:
    """Megatron's NullTokenizer flags: --vocab-size and its ids (data inspect and sample print ids)."""
    from gptrain.data.null_tokenizer import NullOptions

    return NullOptions(
        getattr(args, "vocab_size", None), args.null_tokenizer_eod_id, args.null_tokenizer_pad_id
    )


def warn_other_vocabulary(
    prefixes: list[str], tokenizer: Any, args: argparse.Namespace, where: str = ""
) -> None:
    """A warning where the data's tokenizer record names another vocabulary than the tokenizer the
    flags name: the text printed is then not the data's (data sample and inspect still print it:
    they are for looking). `where`: the flag naming the prefixes, if any. Nothing for NullTokenizer,
    which prints the ids whichever tokenizer made them."""
    from gptrain.data.null_tokenizer import NullTokenizer
    from gptrain.data.tokenizer_fingerprint import fingerprint, vocabulary_conflict

    if isinstance(tokenizer, NullTokenizer):
        return

    def live() -> tuple[dict[str, Any], list[str | None]]:
        files = [file for file in (args.vocab_file, args.merge_file, args.tokenizer_model) if file]
        entry, table = fingerprint(tokenizer, files)
        return entry | {"type": tokenizer_type(args)}, table

    conflict = vocabulary_conflict(prefixes, live, "the tokenizer given", "", where, "")
    if conflict is not None:
        print(
            f"gptrain: warning: {conflict[0]}; the text is decoded with the tokenizer given: give the files "
            "the data was tokenized with to see its text",
            file=sys.stderr,
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
