"""Tokenizer and vocabulary flags that combine, as Megatron reads them together."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from gptrain.errors import ConfigError
from gptrain.megatron.defaults import MEGATRON_DEFAULTS
from gptrain.megatron.flag_parsing import convert_value
from gptrain.utils.tokenizer_types import check_null_settings, names_a_file

if TYPE_CHECKING:
    from gptrain.megatron.translation import Translation


def null_tokenizer(result: Translation) -> None:
    """Megatron's NullTokenizer has --vocab-size ids, the last one the end of document (since core
    0.18; up to 0.17 it added that one: --vocab-size + 1), padded as any vocabulary. On a dataset
    (tokenized with the user's own tokenizer, Megatron's pre-tokenized data) it is
    model.tokenizer.type=NullTokenizer with model.tokenizer.vocab_size; gptrain's mock data without
    a tokenizer is that vocabulary."""
    v, given = result.values, result.given
    if v.get("model.tokenizer.type") != "NullTokenizer":
        return
    if "--vocab-size" not in given:
        raise ConfigError("--tokenizer-type NullTokenizer needs --vocab-size, as in Megatron")
    size = v["model.data.mock_vocab_size"]
    _check_null_flags(result, size, mock=v.get("model.data.data_impl") == "mock")
    versions = (
        "as Megatron's since core 0.18; up to core 0.17 it added one, the end of document "
        f"{size}: give --vocab-size {size + 1} for that vocabulary"
    )
    if v.get("model.data.data_impl") == "mock":
        v["model.tokenizer.type"] = MEGATRON_DEFAULTS["model.tokenizer.type"]  # read by no tokenizer
        result.notes.append(
            f"--tokenizer-type NullTokenizer (a vocabulary of --vocab-size {size} ids, {versions})"
        )
        return
    v["model.tokenizer.vocab_size"] = v.pop("model.data.mock_vocab_size")
    result.notices.append(
        f"--tokenizer-type NullTokenizer: ids 0 to {size - 1}, the end of document "
        f"{_null_eod(given, size)} ({versions}); the data's largest id is checked against them at the start"
    )


def _check_null_flags(result: Translation, size: int, mock: bool) -> None:
    """NullTokenizer's --vocab-size (and on a dataset its --null-tokenizer-eod-id/-pad-id), checked as
    the config checks them, before its note says the ids they give ('ids 0 to -1'); named by flag."""
    ids = [None, None]
    if not mock:
        given = result.given
        ids = [convert_value(flag, given[flag][0], int) if flag in given else None for flag in NULL_IDS]
    try:
        check_null_settings(size, *ids)
    except ConfigError as error:
        raise ConfigError(result.in_flags(str(error))) from None


def _null_eod(given: dict[str, list[str]], size: int) -> int:
    """NullTokenizer's end of document: --null-tokenizer-eod-id, else the last id."""
    flag = "--null-tokenizer-eod-id"
    return convert_value(flag, given[flag][0], int) if flag in given else size - 1


NULL_IDS = {
    "--null-tokenizer-eod-id": "model.tokenizer.null_eod_id",
    "--null-tokenizer-pad-id": "model.tokenizer.null_pad_id",
}


def null_tokenizer_ids(result: Translation) -> None:
    """--null-tokenizer-eod-id and --null-tokenizer-pad-id (core 0.18) set NullTokenizer's ids,
    which documents end with and its loss masks: NullTokenizer's keys on a dataset. gptrain's mock
    samples are uniform random ids, so there neither has a token to find."""
    kind = _tokenizer_type(result.given)
    mock = result.values.get("model.data.data_impl") == "mock"
    for flag, none in (
        ("--null-tokenizer-eod-id", "documents to end"),
        ("--null-tokenizer-pad-id", "padding to mask"),
    ):
        if flag not in result.given:
            continue
        value = convert_value(flag, result.given[flag][0], int)
        if kind == "NullTokenizer" and not mock:
            result.values[NULL_IDS[flag]] = value
        elif kind == "NullTokenizer":
            result.notes.append(f"{flag} (gptrain's mock data is uniform random ids, without {none})")
        else:
            result.notes.append(f"{flag} (Megatron reads it only for NullTokenizer, not {kind})")


def sentencepiece_vocabulary(result: Translation) -> None:
    """gptrain's SentencePieceTokenizer is Megatron's legacy one, as `data prepare` encodes it (data
    and model agree). Megatron's tokenizer system of core 0.15 gave the GPT dataset the model's eos as
    the end of document (the model kept the legacy vocabulary), and from core 0.17, with the legacy
    system gone, the vocabulary is the model's pieces alone: said where the model is read (not mock
    data without one), not with --legacy-tokenizer."""
    if _tokenizer_type(result.given) != "SentencePieceTokenizer" or "--legacy-tokenizer" in result.given:
        return
    if not result.values.get("model.tokenizer.model"):
        return
    result.notices.append(
        "--tokenizer-type SentencePieceTokenizer builds Megatron's legacy vocabulary (the model's pieces, then "
        "<CLS> <SEP> <EOD> <MASK> and the <PAD>/<BOS>/<EOS> it lacks; <EOD> ends documents), as Megatron-LM up "
        "to core 0.14 and with --legacy-tokenizer; core 0.15 and 0.16 end documents with the model's eos, and "
        "from core 0.17 the vocabulary is the model's pieces alone: GPTSentencePieceTokenizer's, give that "
        "type (and data prepared with it) for them"
    )


def _tokenizer_type(given: dict[str, list[str]]) -> str:
    """The --tokenizer-type given (Megatron's default where absent), NullTokenizer included."""
    return (given.get("--tokenizer-type") or [MEGATRON_DEFAULTS["model.tokenizer.type"]])[0]


def tokenizers_vocabulary(result: Translation) -> None:
    """Megatron reads --vocab-size for NullTokenizer and TikTokenizer only: beside a tokenizer's files
    (GPT-2's vocab and merges, a tokenizer.json, a SentencePiece model) the vocabulary is the
    tokenizer's, with mock data too, where gptrain would otherwise take --vocab-size instead."""
    v, given = result.values, result.given
    kind = _tokenizer_type(given)
    has_files = v.get("model.tokenizer.vocab_file") or v.get("model.tokenizer.model")
    if "--vocab-size" in given and kind not in ("NullTokenizer", "TikTokenizer") and has_files:
        del v["model.data.mock_vocab_size"]
        result.notes.append(
            f"--vocab-size (Megatron reads it only with NullTokenizer and TikTokenizer: the vocabulary is {kind}'s)"
        )


def vocab_extra_ids(result: Translation) -> None:
    """Megatron passes --vocab-extra-ids to BERT's tokenizers and its legacy SentencePieceTokenizer
    only (T5's <extra_id_N> span tokens, which grow the vocabulary): with any other type it trains
    unchanged, as `data prepare` says too; with SentencePieceTokenizer gptrain has no such rows."""
    if "--vocab-extra-ids" not in result.given:
        return
    count = convert_value("--vocab-extra-ids", result.given["--vocab-extra-ids"][0], int)
    if count < 0:
        raise ConfigError(f"--vocab-extra-ids {count}: give 0 or more")
    if count and _tokenizer_type(result.given) == "SentencePieceTokenizer":
        raise ConfigError(
            f"--vocab-extra-ids {count}: Megatron's legacy SentencePieceTokenizer adds <extra_id_0> ... to "
            "its vocabulary (T5's span masking), which gptrain does not; drop the flag or give 0"
        )


# Megatron's TikTokenizer flags (the last its older name of --tokenizer-special-tokens)
TIKTOKEN_FLAGS = (
    "--tiktoken-pattern",
    "--tiktoken-num-special-tokens",
    "--tokenizer-special-tokens",
    "--tiktoken-special-tokens",
)


def tiktoken_flags(result: Translation) -> None:
    """Megatron's TikTokenizer reads a tiktoken vocabulary file with --tiktoken-pattern,
    --vocab-size, --tiktoken-num-special-tokens and --tokenizer-special-tokens (or its older name
    --tiktoken-special-tokens, which Megatron reads only where the newer one is absent); with another
    tokenizer the TikTokenizer flags change nothing (as in Megatron's llama3 example's mock-data
    branch), but its special tokens are added to it, which gptrain does not do (NullTokenizer, built
    from --vocab-size alone, ignores them too). gptrain's
    TikTokenizer also takes a tiktoken encoding name (cl100k_base), whose split is its own."""
    v, given = result.values, result.given
    kind = _tokenizer_type(given)
    model = v.get("model.tokenizer.model")
    specials = [flag for flag in ("--tokenizer-special-tokens", "--tiktoken-special-tokens") if flag in given]
    if kind != "TikTokenizer":
        if "--tokenizer-special-tokens" in given and kind != "NullTokenizer":
            raise ConfigError(
                f"--tokenizer-special-tokens: Megatron adds them to {kind}'s vocabulary, which gptrain does "
                "not; prepare the data with a tokenizer that holds them, or drop the flag"
            )
        for flag in TIKTOKEN_FLAGS:
            if flag in given:
                result.notes.append(_ignored_tiktoken_flag(flag, kind))
        return
    if model and not names_a_file(model) and not os.path.isfile(model):  # an encoding name
        if named := [flag for flag in TIKTOKEN_FLAGS if flag in given]:
            raise ConfigError(
                f"{', '.join(named)}: --tokenizer-model {model} is a tiktoken encoding name, with its own "
                "split, vocabulary and special tokens; drop the flag, or give Megatron's tiktoken vocabulary file"
            )
        return
    if "--tiktoken-pattern" in given:
        v["model.tokenizer.tiktoken_pattern"] = convert_value(
            "--tiktoken-pattern", given["--tiktoken-pattern"][0], {"v1": "v1", "v2": "v2"}
        )
    if "--tiktoken-num-special-tokens" in given:
        count = convert_value("--tiktoken-num-special-tokens", given["--tiktoken-num-special-tokens"][0], int)
        v["model.tokenizer.tiktoken_num_special_tokens"] = count
    if specials:
        v["model.tokenizer.special_tokens"] = list(given[specials[0]])
    if "--vocab-size" in given:  # the tokenizer's vocabulary, with mock data too
        v["model.tokenizer.vocab_size"] = v.pop("model.data.mock_vocab_size")


def padded_vocab(result: Translation) -> None:
    """--padded-vocab-size N (Megatron since August 2025) is the embedding's rows, padding skipped, at
    any tensor-parallel size: model.padded_vocab_size, recorded as N so that a resume under another TP
    keeps them (the config and the layout check it against the tokenizer and TP)."""
    rows = result.values.get("model.padded_vocab_size")
    if rows is not None:
        result.notices.append(
            f"--padded-vocab-size {rows}: {rows} embedding rows at any --tensor-model-parallel-size"
        )


def no_pad_vocab(result: Translation) -> None:
    """--no-pad-vocab-size (or --disable-pad-vocab-size; Megatron's tokenizer flags since core 0.18)
    skips the padding: the vocabulary's own rows, whatever --make-vocab-size-divisible-by says, where
    --padded-vocab-size does not set them. Under TP they are rounded up to a multiple of it, where
    Megatron's vocabulary-parallel embedding stops unless TP divides them."""
    switch = next(
        (flag for flag in ("--no-pad-vocab-size", "--disable-pad-vocab-size") if flag in result.given), None
    )
    if switch is None:
        return
    v = result.values
    if v.get("model.padded_vocab_size") is not None:
        result.notes.append(f"{switch} (--padded-vocab-size sets the rows)")
        return
    v["model.make_vocab_size_divisible_by"] = 1
    said = f"{switch}: the embedding has the vocabulary's rows, unpadded (--make-vocab-size-divisible-by 1)"
    tp = v.get("model.tensor_model_parallel_size", 1)
    if tp > 1:
        said += f", at --tensor-model-parallel-size {tp} rounded up to a multiple of it (Megatron stops unless it divides them)"
    result.notices.append(said)


def eod_mask_on_mock_data(result: Translation) -> None:
    """Megatron's mock documents end with the tokenizer's end of document, which --eod-mask-loss takes
    out of the loss; gptrain's mock samples are uniform random ids, with a tokenizer too: without one
    (--vocab-size alone, NullTokenizer) there is no end of document to mask, with one only its id
    where drawn by chance. Said either way."""
    v = result.values
    if "--eod-mask-loss" not in result.given or v.get("model.data.data_impl") != "mock":
        return
    if v.get("model.data.mock_vocab_size"):
        masked = "without end-of-document tokens to mask"
    else:
        masked = (
            "not documents ending with the end of document Megatron's mock data masks: only that id drawn "
            "by chance is masked"
        )
    result.notes.append(f"--eod-mask-loss (gptrain's mock data is uniform random ids, {masked})")


def _ignored_tiktoken_flag(flag: str, kind: str) -> str:
    """The note for a TikTokenizer flag beside `kind`, which Megatron builds without it."""
    if kind == "NullTokenizer" and flag in ("--tokenizer-special-tokens", "--tiktoken-special-tokens"):
        return f"{flag} (Megatron's NullTokenizer is --vocab-size ids alone: it ignores them)"
    return f"{flag} (Megatron reads it only for TikTokenizer, not {kind})"
