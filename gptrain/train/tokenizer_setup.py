"""The run's tokenizer from model.tokenizer (its files checked first) and the vocabulary it pads to."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from gptrain.config import TrainingConfig
from gptrain.errors import ConfigError
from gptrain.utils.rank import is_rank_zero


def build_tokenizer(cfg: TrainingConfig) -> Any | None:
    """The tokenizer; None with mock data and data.mock_vocab_size (which then sets the vocabulary)."""
    tok = cfg.model.tokenizer
    if not cfg.model.data.builds_tokenizer():
        return None
    from gptrain.data.tokenizers import build_tokenizer as build

    check_tokenizer_files(cfg)
    check_use_fast(tok)
    return build(
        tok.type,
        vocab_file=tok.vocab_file,
        merge_file=tok.merge_file,
        model=tok.model,
        tiktoken=tiktoken_options(tok),
        legacy=tok.legacy,
        null=null_options(tok),
    )


def null_options(tok: Any) -> Any:
    """model.tokenizer's NullTokenizer settings (read by that type alone)."""
    from gptrain.data.null_tokenizer import NullOptions

    return NullOptions(tok.vocab_size, tok.null_eod_id, tok.null_pad_id)


def check_use_fast(tok: Any) -> None:
    """`use_fast: false` asks NeMo's AutoTokenizer for transformers' slow class: refused where its
    ids may differ from the tokenizer.json gptrain encodes with (config validation took the rest)."""
    from gptrain.data.tokenizer_loaders import slow_class_that_differs

    if tok.use_fast is not False or tok.type != "HuggingFaceTokenizer":
        return
    if (slow := slow_class_that_differs(tok.model)) is not None:
        raise ConfigError(
            f"model.tokenizer.use_fast: false asks for transformers' slow {slow} (as NeMo builds it on "
            f"transformers 4; 5 ignores use_fast), whose ids may differ from those of {tok.model}'s "
            "tokenizer.json that gptrain encodes with: set model.tokenizer.use_fast=true for those ids"
        )


def check_data_tokenizer(
    cfg: TrainingConfig,
    prefixes: list[str] | None = None,
    where: str | None = None,
    tokenizer: Any | None = None,
) -> None:
    """The data's recorded --legacy-tokenizer against model.tokenizer.legacy, and its recorded
    vocabulary against `tokenizer`'s (the run's, built from model.tokenizer), with the policy of a
    checkpoint's tokenizer: refused, or a warning with exp_manager.allow_tokenizer_change; a blend
    prepared with and without --append-eod or split_special_tokens, a warning. `prefixes`
    (named `where`): data other than model.data.data_prefix's (eval's --data-prefix); without them,
    the splits the job builds, as the launch preflight reads them (a split not built is not read)."""
    from gptrain.data.blend_spec import prefixes_of
    from gptrain.data.record_mix import mixed_preparation_lines
    from gptrain.data.tokenizer_record import legacy_conflict
    from gptrain.train.target_sizes import built_split_keys

    tok = cfg.model.tokenizer
    if prefixes is None:
        prefixes = prefixes_of(cfg.model.data.data_prefix, built_split_keys(cfg))
    _refuse_or_warn(cfg, legacy_conflict(prefixes, tok.legacy, tok.type, where=where))
    if tokenizer is not None:
        _refuse_or_warn(cfg, vocabulary_conflict(cfg, tokenizer, prefixes, where))
        for warning in (
            null_eod_warning(cfg, tokenizer, prefixes, where),
            ambiguous_pad_warning(cfg, tokenizer),
        ):
            if warning is not None and is_rank_zero():
                print(warning, file=sys.stderr)
    mixed = mixed_preparation_lines(prefixes, where or "model.data.data_prefix", cfg.model.data.eod_mask_loss)
    for line in mixed if is_rank_zero() else []:
        print(line, file=sys.stderr)


def vocabulary_conflict(
    cfg: TrainingConfig, tokenizer: Any, prefixes: list[str], where: str | None = None
) -> tuple[str, str] | None:
    """(what differs, what to do) where a prefix's recorded vocabulary is not `tokenizer`'s. None for
    NullTokenizer: it exists for data another tokenizer made, and has no tokens to compare (its ids
    are checked against vocab_size instead: check_token_ids)."""
    from gptrain.data.null_tokenizer import NullTokenizer
    from gptrain.data.tokenizer_fingerprint import fingerprint, vocabulary_conflict

    if isinstance(tokenizer, NullTokenizer):
        return None

    def live() -> tuple[dict[str, Any], list[str | None]]:
        entry, table = fingerprint(tokenizer, run_tokenizer_files(cfg))
        return entry | {"type": cfg.model.tokenizer.type}, table

    keys = " and ".join(f"model.tokenizer.{key}" for key in tokenizer_file_keys(cfg) or ("model",))
    return vocabulary_conflict(
        prefixes,
        live,
        "model.tokenizer",
        keys,
        where or "model.data.data_prefix",
        "exp_manager.allow_tokenizer_change=true",
    )


def null_eod_warning(
    cfg: TrainingConfig, tokenizer: Any, prefixes: list[str], where: str | None = None
) -> str | None:
    """A warning where NullTokenizer masks (model.data.eod_mask_loss) another end-of-document id
    than the one the data's tokenizer record names: --append-eod ended its documents with that one,
    so their ends stay in the loss. Not refused: Megatron takes the run, the ids still fit and
    nothing but the mask changes; eod_mask_loss alone reads the id (batch_eod), so without it no warning."""
    from gptrain.data.blend_spec import strip_suffix
    from gptrain.data.null_tokenizer import NullTokenizer
    from gptrain.data.tokenizer_fingerprint import describe
    from gptrain.data.tokenizer_record import read_tokenizer_record, record_path

    if not isinstance(tokenizer, NullTokenizer) or not cfg.model.data.eod_mask_loss:
        return None
    for prefix in map(strip_suffix, prefixes):
        record = read_tokenizer_record(prefix) or {}
        recorded = record.get("vocabulary")
        eod = recorded.get("eod") if isinstance(recorded, dict) else None
        if isinstance(eod, int) and eod != tokenizer.eod:
            return (
                f"gptrain: warning: {where or 'model.data.data_prefix'}: {prefix} was tokenized with "
                f"{describe(record.get('type'), recorded)} ({record_path(prefix)}), whose end-of-document id "
                f"is {eod}; NullTokenizer's is {tokenizer.eod}, which model.data.eod_mask_loss masks: the "
                f"data's document ends stay in the loss; set model.tokenizer.null_eod_id={eod} to mask them"
            )
    return None


def ambiguous_pad_warning(cfg: TrainingConfig, tokenizer: Any) -> str | None:
    """A warning where the tokenizer's padding id (NullTokenizer's, a HuggingFaceTokenizer's
    pad_token) is its end of document and model.data.allow_ambiguous_pad_tokens is off: as Megatron
    core 0.18's GPT dataset, no id is then padding (batch_pad), which would otherwise mask every
    document end's label and read it as id 0."""
    from gptrain.data.null_tokenizer import NullTokenizer
    from gptrain.train.builders import eod_or_none, padding_id

    pad = padding_id(tokenizer)
    if pad is None or pad != eod_or_none(tokenizer) or cfg.model.data.allow_ambiguous_pad_tokens:
        return None
    if isinstance(tokenizer, NullTokenizer):
        what = f"model.tokenizer.null_pad_id={pad} is NullTokenizer's end of document too"
        own = "give a padding id of its own, or set"
    else:
        from gptrain.data.tokenizer_loaders import special_token

        _, config = special_token(Path(tokenizer.source).parent, "pad_token")
        what = f"{config}: its pad_token (id {pad}) is the tokenizer's end of document too"
        own = "set"
    return (
        f"gptrain: warning: {what}: as Megatron's GPT dataset, gptrain masks nothing as padding (Megatron's "
        f"warning: the pad token id collides with another special token id); {own} "
        "model.data.allow_ambiguous_pad_tokens=true (Megatron's --allow-ambiguous-pad-tokens) to mask the "
        "end of document's labels and read it as id 0"
    )


def _refuse_or_warn(cfg: TrainingConfig, conflict: tuple[str, str] | None) -> None:
    if conflict is None:
        return
    text, advice = conflict
    if cfg.exp_manager.allow_tokenizer_change:
        if is_rank_zero():
            print(
                f"gptrain: warning: {text}; going on (exp_manager.allow_tokenizer_change=true)",
                file=sys.stderr,
            )
        return
    raise ConfigError(f"{text}; {advice}")


def tiktoken_options(tok: Any) -> Any:
    """model.tokenizer's TikTokenizer settings, read with Megatron's tiktoken vocabulary file."""
    from gptrain.data.tiktoken_file import TiktokenFileOptions

    specials = tuple(tok.special_tokens) if tok.special_tokens is not None else None
    return TiktokenFileOptions(
        tok.tiktoken_pattern, tok.vocab_size, tok.tiktoken_num_special_tokens, specials
    )


def tokenizer_file_keys(cfg: TrainingConfig) -> tuple[str, ...]:
    """The model.tokenizer keys naming files the tokenizer type reads: a preset's GPT-2 vocab_file
    and merge_file stay in the config of a run with another type, which never reads them."""
    from gptrain.data.tokenizers import canonical_type
    from gptrain.utils.tokenizer_types import is_tiktoken_vocabulary_file as is_vocabulary_file

    tok, kind = cfg.model.tokenizer, canonical_type(cfg.model.tokenizer.type)
    if kind == "null":  # ids alone
        return ()
    if kind == "gpt2" and (tok.vocab_file or tok.merge_file or not tok.model):
        return ("vocab_file", "merge_file")
    if kind != "gpt2" and kind != "tiktoken":  # tokenizer.json, or a SentencePiece tokenizer.model
        return ("model",)
    if kind == "tiktoken" and tok.model and is_vocabulary_file(tok.model):  # Megatron's
        return ("model",)
    return ()  # a tiktoken encoding name, or GPT-2 files in the directory model.tokenizer.model


def check_tokenizer_files(cfg: TrainingConfig) -> None:
    """A missing tokenizer file, or a directory given for one, named by its config key (the
    tokenizer module names data-CLI flags)."""
    from gptrain.data.tokenizer_paths import missing_tokenizer_file
    from gptrain.data.tokenizers import canonical_type
    from gptrain.utils.tokenizer_types import hub_name_advice

    tok = cfg.model.tokenizer
    in_directory = "tokenizer.json" if canonical_type(tok.type) == "huggingface" else None
    for key in tokenizer_file_keys(cfg):
        value = getattr(tok, key)
        found = (
            missing_tokenizer_file(value, in_directory if key == "model" else None) if value else "not set"
        )
        if found is not None and key == "model" and (advice := hub_name_advice(value, _pass_as(tok))):
            raise ConfigError(f"{_model_key(tok)}: {value} is not a local file or directory; {advice}")
        if found is not None:
            raise ConfigError(
                f"model.tokenizer.{key}: {found} (model.tokenizer.type={tok.type}); point it at the file,"
                " or for mock data without tokenizer files set model.data.mock_vocab_size"
            )


def _pass_as(tok: Any) -> str:
    """How a downloaded tokenizer directory is then given: SentencePiece types read its file."""
    from gptrain.data.tokenizers import SENTENCEPIECE_KINDS, canonical_type

    if canonical_type(tok.type) in SENTENCEPIECE_KINDS:
        return "pass DIR/tokenizer.model"
    return "pass the local directory DIR"


def _model_key(tok: Any) -> str:
    """The key the user gave the tokenizer's path in: library huggingface reads it from `type`, as
    NeMo's AutoTokenizer(type) does (validation moved it to `model`)."""
    if str(tok.library).lower() == "huggingface":
        return "model.tokenizer.type (library huggingface's tokenizer path)"
    return "model.tokenizer.model"


def padded_vocab_size(cfg: TrainingConfig, tokenizer: Any | None) -> tuple[int, int]:
    """(unpadded, padded) vocabulary: from the tokenizer, or data.mock_vocab_size with mock data; a
    model.padded_vocab_size below it is refused here, at the start, before the model is built."""
    from gptrain.models.flops import vocab_rows

    if tokenizer is not None:
        vocab, source = int(tokenizer.vocab_size), "the tokenizer"
    elif cfg.model.data.mock_vocab_size:
        vocab, source = int(cfg.model.data.mock_vocab_size), "model.data.mock_vocab_size"
    else:
        raise ConfigError("no tokenizer files and no model.data.mock_vocab_size: set one of them")
    # As Megatron: model.padded_vocab_size, else a multiple of make_vocab_size_divisible_by x TP, so
    # parameter counts and FLOPs match its logs under any layout.
    m = cfg.model
    padded = vocab_rows(
        vocab, m.make_vocab_size_divisible_by, m.tensor_model_parallel_size, m.padded_vocab_size, source
    )
    return vocab, padded


def run_tokenizer_files(cfg: TrainingConfig) -> list[str]:
    """The files model.tokenizer is read from (a tiktoken encoding: its name), as the loader picks them."""
    tok = cfg.model.tokenizer
    return [str(getattr(tok, key)) for key in tokenizer_file_keys(cfg)] or [str(tok.model)]


def tokenizer_check(cfg: TrainingConfig, tokenizer: Any | None) -> Any | None:
    """The run's tokenizer as checkpoints record it (gptrain.data.tokenizer_identity); mock data
    without one: its model.data.mock_vocab_size, so that a mock run and a real one do not resume
    each other's checkpoints unchecked (None: neither, nothing to record)."""
    from gptrain.data.tokenizer_identity import TokenizerCheck

    allow = cfg.exp_manager.allow_tokenizer_change
    if tokenizer is None:
        size = cfg.model.data.mock_vocab_size
        return TokenizerCheck.mock(int(size), allow) if size else None
    from gptrain.data.tokenizers import canonical_type

    tok = cfg.model.tokenizer
    source = " + ".join(run_tokenizer_files(cfg))
    if canonical_type(tok.type) == "null":  # no files: its settings
        source = f"(vocab_size {tokenizer.vocab_size}, eod {tokenizer.eod})"
    return TokenizerCheck.of(tokenizer, tok.type, source, allow)


def check_token_ids(
    cfg: TrainingConfig,
    tokenizer: Any | None,
    prefixes: list[str] | None = None,
    where: str = "model.data.data_prefix",
) -> None:
    """NullTokenizer's data, checked to hold no id past model.tokenizer.vocab_size before the first
    step where that is cheap (gptrain.data.token_bound; a large corpus is checked per sample, as its
    batches are made): its files would have told; with NullTokenizer nothing does. `prefixes`
    (named `where`): data other than model.data.data_prefix's (eval's --data-prefix)."""
    from gptrain.data.null_tokenizer import NullTokenizer

    if not isinstance(tokenizer, NullTokenizer):
        return
    from gptrain.data.blend_spec import prefixes_of
    from gptrain.data.gpt_dataset import default_cache_dir
    from gptrain.data.token_bound import check_ids_fit
    from gptrain.train.target_sizes import built_split_keys

    cache = cfg.model.data.index_mapping_dir
    if prefixes is None:
        prefixes = prefixes_of(cfg.model.data.data_prefix, built_split_keys(cfg))
    check_ids_fit(
        prefixes,
        tokenizer.vocab_size,
        lambda prefix: cache or default_cache_dir(prefix, "GPTDataset"),
        where,
        cfg.model.data.token_scan_limit_gb,
    )
