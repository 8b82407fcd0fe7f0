"""The launch preflight's tokenizer checks: the files the job's tokenizer type reads, picked and
looked up as the job picks them, and its id count against model.padded_vocab_size, all without
torch or the tokenizer libraries (login nodes)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gptrain.errors import ConfigError, LaunchError
from gptrain.utils.paths import look_up
from gptrain.utils.tokenizer_types import hub_name_advice

if TYPE_CHECKING:
    from gptrain.config import TrainingConfig


def check_vocabulary_rows(cfg: TrainingConfig) -> None:
    """model.padded_vocab_size under the tokenizer's ids, refused in the job's words (as it starts,
    after the queue wait): the ids counted from vocab.json or tokenizer.json without the tokenizer
    library; left to the job where they cannot be (SentencePiece, tiktoken, a file fetched later).
    The config refuses one under model.data.mock_vocab_size as it loads."""
    from gptrain.utils.vocab_rows import vocab_rows

    m = cfg.model
    if m.padded_vocab_size is None:
        return
    if not m.data.builds_tokenizer():
        ids, source = int(m.data.mock_vocab_size), "model.data.mock_vocab_size"
    else:
        ids, source = tokenizer_ids(m.tokenizer), "the tokenizer"
    if ids is None:
        return
    try:
        vocab_rows(
            ids, m.make_vocab_size_divisible_by, m.tensor_model_parallel_size, m.padded_vocab_size, source
        )
    except ConfigError as error:
        raise LaunchError(f"training: {error}") from None


def tokenizer_ids(tok: Any) -> int | None:
    """The ids of a GPT-2 BPE, HuggingFaceTokenizer or NullTokenizer tokenizer as the job's tokenizer
    counts them (the highest id + 1: a vocabulary may skip ids; a tokenizer.json's added tokens
    numbered as the library numbers them, not by their "id"), or None where its files do not tell
    them here."""
    kind = _kind(tok.type)
    if kind == "null":
        return int(tok.vocab_size) if tok.vocab_size else None
    if kind == "gpt2":
        directory = tok.model if not (tok.vocab_file or tok.merge_file) and tok.model else None
        from gptrain.data.tokenizer_fingerprint import json_or_none

        vocab = json_or_none(str(Path(directory) / "vocab.json") if directory else tok.vocab_file)
        ids = list(vocab.values()) if isinstance(vocab, dict) else []
    elif kind == "huggingface" and tok.model:
        from gptrain.data.tokenizer_fingerprint import table_from_files

        table = table_from_files(kind, None, str(tok.model))  # the ids as `tokenizers` gives them
        ids = [len(table) - 1] if table else []
    else:
        return None
    ids = [i for i in ids if isinstance(i, int) and not isinstance(i, bool)]
    return max(ids) + 1 if ids else None


def vocabulary_conflict(tok: Any, prefixes: list[str]) -> tuple[str, str] | None:
    """The data's recorded vocabulary against the token table of training.model.tokenizer's
    vocab.json or tokenizer.json, read with json alone (gptrain.data.tokenizer_fingerprint); the
    merges, end-of-document id and other types are the job's to check, with the tokenizer loaded."""
    from gptrain.data.tokenizer_fingerprint import digest, table_from_files
    from gptrain.data.tokenizer_fingerprint import vocabulary_conflict as conflict

    kind = _kind(tok.type)
    directory = tok.model if kind == "gpt2" and not (tok.vocab_file or tok.merge_file) and tok.model else None
    vocab_file = str(Path(directory) / "vocab.json") if directory else tok.vocab_file
    files = [vocab_file, str(Path(directory) / "merges.txt") if directory else tok.merge_file]
    if kind != "gpt2":
        files = [tok.model]

    def live() -> tuple[dict[str, Any], list[str | None]] | None:
        table = table_from_files(kind, vocab_file, tok.model)
        if table is None:
            return None
        absolute = [os.path.abspath(file) for file in files if file]
        return {"type": tok.type, "files": absolute, "size": len(table), "tokens": digest(table)}, table

    named = ("vocab_file", "merge_file") if kind == "gpt2" and directory is None else ("model",)
    return conflict(
        prefixes,
        live,
        "training.model.tokenizer",
        " and ".join(f"training.model.tokenizer.{key}" for key in named),
        "training.model.data.data_prefix",
        "training.exp_manager.allow_tokenizer_change=true",
    )


def check_tokenizer_files(
    tokenizer: dict[str, Any], where: str, fetched: dict[str, str] | None = None
) -> str:
    """The tokenizer's files exist, or are among `fetched` ({path: URL} the data preparation
    stage downloads when missing)."""
    urls = fetched or {}
    found, to_fetch = [], []
    in_directory = _model_directory_file(tokenizer.get("type"))
    for key in _file_keys_read(tokenizer):
        value, name = tokenizer.get(key), _given_as(tokenizer, key)
        if value in (None, "") and key in _keys_required(tokenizer):  # the job: 'not set', after the queue
            raise LaunchError(
                f"{where}.{key}: not set ({where}.type={tokenizer.get('type')} reads it); point it at the file"
            )
        if value and ("/" in str(value) or str(value).endswith((".json", ".txt", ".model"))):
            if _is_file(str(value), f"{where}.{name}", in_directory if key == "model" else ()):
                found.append(key)
            elif str(value) in urls:
                to_fetch.append(f"{key} from {urls[str(value)]}")
            elif key == "model" and (advice := hub_name_advice(value)) is not None:
                raise LaunchError(f"{where}.{name}: {value} is not a local file or directory; {advice}")
            else:
                raise LaunchError(f"{where}.{name}: {value} not found")
    if "model" in found:
        check_tiktoken_vocabulary(tokenizer, where)
    named = [_given_as(tokenizer, key).split(" ")[0] for key in found]
    line = f"ok  {where}: {', '.join(named) or 'no files'} present"
    return line + (f"; data_preparation fetches {', '.join(to_fetch)}" if to_fetch else "")


def _given_as(tokenizer: dict[str, Any], key: str) -> str:
    """The key the user gave `key`'s file in: library huggingface's tokenizer path is `type`, as
    NeMo's AutoTokenizer(type) reads it (validation moved it to `model`), as gptrain train names it."""
    if key == "model" and str(tokenizer.get("library")).lower() == "huggingface":
        return "type (library huggingface's tokenizer path)"
    return key


def check_tiktoken_vocabulary(tokenizer: dict[str, Any], where: str) -> None:
    """Megatron's TikTokenizer vocabulary file read with its settings as the job reads it (stdlib
    only), so that a file too short for vocab_size, or a bad entry, is said before the queue."""
    model = str(tokenizer.get("model"))
    if not _is_tiktoken(tokenizer.get("type")) or not model.endswith(".json"):
        return
    from gptrain.data.tiktoken_file import TiktokenFileOptions, read_ranks
    from gptrain.errors import GptrainError

    specials = tokenizer.get("special_tokens")
    options = TiktokenFileOptions(
        tokenizer.get("tiktoken_pattern"),
        tokenizer.get("vocab_size"),
        tokenizer.get("tiktoken_num_special_tokens"),
        tuple(specials) if specials is not None else None,
    )
    try:
        _, vocab_size, count, _ = options.resolved()
        read_ranks(model, vocab_size - count, count)
    except GptrainError as error:
        raise LaunchError(f"{where}: {_keys_under(str(error), where)}") from None


def _is_tiktoken(kind: object) -> bool:
    """TikTokenizer by any spelling data prepare and training take (`tiktoken`, `tiktokenizer`); an
    unknown type is for data prepare or the config to refuse."""
    from gptrain.data.tokenizer_args import canonical_type

    try:
        return kind is not None and canonical_type(str(kind)) == "tiktoken"
    except ConfigError:
        return False


def _keys_under(message: str, where: str) -> str:
    """The tokenizer's keys named where this config holds them (data_preparation.tokenizer.vocab_size),
    not under the training config's model.tokenizer, as the reader names them."""
    return message.replace("model.tokenizer.", f"{where}.")


def _is_file(path: str, name: str, in_directory: tuple[str, ...] = ()) -> bool:
    """Whether `path` is a file (or a directory holding every file of `in_directory`, as the job
    reads it); one under a directory this user may not search is a LaunchError naming `name`
    (Path.is_file raised PermissionError there: a traceback, even under --dry-run), as is a
    directory without one of them."""
    found = look_up(path)
    if found.kind == "unreachable":
        raise LaunchError(f"{name}: {path} {found.why}")
    if found.kind == "directory" and in_directory:
        for file in in_directory:
            if not _is_file(os.path.join(path, file), name):
                raise LaunchError(f"{name}: {path} is a directory with no {file} in it")
        return True
    return found.kind == "file"


def _kind(tokenizer_type: object) -> str | None:
    """gptrain's kind of a tokenizer type by any spelling, or None for an unknown one (the config's
    or data prepare's to refuse)."""
    from gptrain.data.tokenizer_args import canonical_type

    try:
        return canonical_type(str(tokenizer_type)) if tokenizer_type is not None else None
    except ConfigError:
        return None


def _file_keys_read(tokenizer: dict[str, Any]) -> tuple[str, ...]:
    """The tokenizer keys whose files its type reads, as the job picks them
    (gptrain.train.tokenizer_setup.tokenizer_file_keys): a preset's GPT-2 vocab_file and merge_file stay in
    the config of a run of another type, which never reads them; all where the type is unknown."""
    kind = _kind(tokenizer.get("type"))
    if kind is None:
        return ("vocab_file", "merge_file", "model")
    if kind == "null":  # ids alone
        return ()
    if kind == "gpt2" and (
        tokenizer.get("vocab_file") or tokenizer.get("merge_file") or not tokenizer.get("model")
    ):
        return ("vocab_file", "merge_file")  # the job reads no model beside them, and both without one
    return ("model",)


def _keys_required(tokenizer: dict[str, Any]) -> tuple[str, ...]:
    """The keys of _file_keys_read the job refuses unset (tokenizer_setup.check_tokenizer_files): all
    but a tiktoken model (an encoding name, or none) and those of an unknown type (the config's to refuse)."""
    return () if _kind(tokenizer.get("type")) in (None, "tiktoken") else _file_keys_read(tokenizer)


def _model_directory_file(tokenizer_type: object) -> tuple[str, ...]:
    """The files the type reads in a directory given as its model: a HuggingFaceTokenizer's
    tokenizer.json, GPT-2 BPE's vocab.json and merges.txt; none: a directory is no model of it."""
    files = {"huggingface": ("tokenizer.json",), "gpt2": ("vocab.json", "merges.txt")}
    return files.get(_kind(tokenizer_type) or "", ())
