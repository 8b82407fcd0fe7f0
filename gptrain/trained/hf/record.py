"""What `gptrain import` keeps of the transformers config for `gptrain export` (no torch).

gptrain's config has no place for a model's BOS/EOS ids or for embedding rows beyond its
tokenizer, so import writes them to `hf_import.json` beside hparams.yaml; export restores them
(also for a run started from the import with exp_manager.resume_from_checkpoint).
Without it (a run gptrain trained), BOS/EOS come from the tokenizer files, and the end-of-document
id stands for both only for GPT-2 BPE, whose convention that is.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from gptrain.data.tokenizers import SENTENCEPIECE_KINDS, canonical_type
from gptrain.errors import DataError
from gptrain.utils.atomic import atomic_write_text

RECORD = "hf_import.json"
TOKEN_KEYS = ("bos_token_id", "eos_token_id", "pad_token_id")
GENERATION_CONFIG = "generation_config.json"
GENERATION_KEY = "generation_config"


def write_record(
    directory: Path,
    hf_config: Any,
    source: Path,
    dtype: str | None = None,
    generation: dict[str, Any] | None = None,
) -> None:
    """The imported model's token ids and embedding rows, as its config.json gives them, the
    `dtype` its weights are stored in (export writes that by default) and its `generation`
    config (`source_generation_config`); `source` absolute, as it was given here (the record is
    read from other working directories)."""
    record: dict[str, Any] = {
        "source": os.path.abspath(source),
        "vocab_size": int(hf_config.vocab_size),
        "dtype": dtype,
    }
    record.update({key: getattr(hf_config, key, None) for key in TOKEN_KEYS})
    record[GENERATION_KEY] = generation
    atomic_write_text(directory / RECORD, json.dumps(record, indent=2) + "\n")


def source_generation_config(hf_dir: Path) -> dict[str, Any] | None:
    """The model's generation_config.json as written, less the transformers version that wrote
    it (None: it has none): its sampling defaults, which vLLM and transformers' generate() start
    from, and often the only list of a chat model's end tokens (Llama 3 Instruct's <|eot_id|>)."""
    path = hf_dir / GENERATION_CONFIG
    if not path.is_file():
        return None
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except ValueError as error:  # a UnicodeDecodeError too
        raise DataError(f"{path}: not JSON ({error}); fix it, or remove it to import without it") from None
    if not isinstance(config, dict):
        raise DataError(f"{path}: expected a JSON object; fix it, or remove it to import without it")
    config.pop("transformers_version", None)
    check_generation_config(config, str(path), "fix it, or remove it to import without it")
    return config


def check_generation_config(config: dict[str, Any], where: str, remedy: str) -> None:
    """transformers' own check of a generation config, which from_pretrained runs on the model
    directory's generation_config.json and fails on (a traceback from verification, and an export
    that does not load): a one-line DataError naming `where` and the `remedy`. Sampling flags it
    only warns about (temperature beside do_sample=false, as many released models have) pass."""
    from transformers import GenerationConfig

    try:
        GenerationConfig.from_dict(dict(config))
    except (ValueError, TypeError, AttributeError) as error:  # AttributeError: a non-dict sub-config
        reason = " ".join(str(error).split())
        raise DataError(f"{where}: transformers refuses it ({reason}); {remedy}") from None


def generation_defaults(record: dict[str, Any]) -> dict[str, Any]:
    """The imported model's generation config, as recorded ({} for a run gptrain trained, or an
    import from before it was recorded)."""
    generation = record.get(GENERATION_KEY)
    return dict(generation) if isinstance(generation, dict) else {}


def recorded_end_ids(record: dict[str, Any]) -> list[Any]:
    """The eos_token_id(s) of the imported model's config.json and generation_config.json, as
    written there (an id, a list of ids, or null)."""
    ids: list[Any] = []
    for eos in (record.get("eos_token_id"), generation_defaults(record).get("eos_token_id")):
        ids += eos if isinstance(eos, list) else [eos]
    return ids


def read_record(run_dir: Path) -> dict[str, Any]:
    """The import record of the run in `run_dir` ({} for a run gptrain trained)."""
    path = run_dir / RECORD
    if not path.is_file():
        return {}
    try:
        record = json.loads(path.read_text())
    except ValueError as error:
        raise DataError(f"{path}: not JSON ({error}); restore it or delete it") from None
    if not isinstance(record, dict):
        raise DataError(f"{path}: expected a JSON object; restore it or delete it")
    return record


def run_record(run_dir: Path) -> dict[str, Any]:
    """The import record of the run in `run_dir`, else of the run it started from
    (exp_manager.resume_from_checkpoint: a run, checkpoints or step directory), followed back
    through such runs to the import: a continued pretraining in a directory of its own exports
    the imported model's BOS/EOS and rows too."""
    return find_run_record(run_dir)[1]


def find_run_record(run_dir: Path) -> tuple[Path | None, dict[str, Any]]:
    """`run_record`, with the file it is in (an error about it names where to correct it)."""
    seen: set[Path] = set()
    directory: Path | None = run_dir.resolve()
    while directory is not None and directory not in seen:
        seen.add(directory)
        record = read_record(directory)
        if record:
            return directory / RECORD, record
        started_from = _started_from(directory)
        directory = _run_dir_of(started_from) if started_from else None
    return None, {}


def _run_dir_of(checkpoint: Path) -> Path | None:
    """The run directory (the one with hparams.yaml) of a run, checkpoints or step directory."""
    found = next(
        (
            d
            for d in (checkpoint, checkpoint.parent, checkpoint.parent.parent)
            if (d / "hparams.yaml").is_file()
        ),
        None,
    )
    return found.resolve() if found is not None else None


def _started_from(run_dir: Path) -> Path | None:
    """The exp_manager.resume_from_checkpoint of the run in `run_dir` (None if it names none), as
    its hparams.yaml records it. Recorded absolute since 2026-11-28; a relative one (earlier runs)
    is taken from the directory the run was started in, where its explicit_log_dir is relative
    too (else from the working directory, the only guess left)."""
    from gptrain.config.yamlio import load_file
    from gptrain.utils.paths import started_in

    config = load_file(run_dir / "hparams.yaml")
    exp_manager = config.get("exp_manager") if isinstance(config, dict) else None
    if not isinstance(exp_manager, dict):
        return None
    value, log_dir = exp_manager.get("resume_from_checkpoint"), exp_manager.get("explicit_log_dir")
    if not isinstance(value, str) or not value:
        return None
    started = started_in(run_dir, log_dir) if isinstance(log_dir, str) and log_dir else None
    return Path(value) if started is None else started / value


def special_token_ids(cfg: Any, tokenizer: Any | None, record: dict[str, Any]) -> dict[str, Any]:
    """bos/eos (and pad, when known) ids for config.json and generation_config.json."""
    if record:  # the imported model's own ids
        ids = {key: record.get(key) for key in TOKEN_KEYS}
        if ids["pad_token_id"] is None:
            del ids["pad_token_id"]
        return ids
    if tokenizer is None:
        return {"bos_token_id": None, "eos_token_id": None}
    kind = canonical_type(cfg.model.tokenizer.type)
    if kind == "null":  # its end of document, and its padding where the run masked one
        pad = {"pad_token_id": tokenizer.pad} if null_pad_exported(tokenizer) else {}
        return {"bos_token_id": None, "eos_token_id": tokenizer.eod, **pad}
    if kind in SENTENCEPIECE_KINDS:  # the model's bos (Megatron's <BOS> if it has none), EOD as eos
        return {"bos_token_id": tokenizer.bos_id, "eos_token_id": _eod_or_none(tokenizer)}
    if kind == "tiktoken" and tokenizer.bos_id is not None:  # Megatron's vocabulary file: <s>, </s>
        return {"bos_token_id": tokenizer.bos_id, "eos_token_id": tokenizer.eod}
    if kind != "huggingface":  # GPT-2 BPE (and tiktoken's GPT-style encodings): <|endoftext|> is both
        return {"bos_token_id": tokenizer.eod, "eos_token_id": tokenizer.eod}
    named = _hf_named_tokens(Path(cfg.model.tokenizer.model))
    eos = named.get("eos_token")
    return {
        "bos_token_id": named.get("bos_token"),
        "eos_token_id": eos if eos is not None else _eod_or_none(tokenizer),
    }


def null_pad_exported(tokenizer: Any) -> bool:
    """Whether NullTokenizer's padding id is one of the exported rows (config.json's vocab_size, its
    vocab_size): transformers builds the embedding's padding row at pad_token_id and refuses one past
    them (Llama: 'Padding_idx must be within num_embeddings'), as Megatron's help suggests an id
    outside the data's."""
    return 0 <= tokenizer.pad < tokenizer.vocab_size


def _eod_or_none(tokenizer: Any) -> int | None:
    try:
        return int(tokenizer.eod)
    except DataError:  # a tokenizer.json without an end-of-document token
        return None


def _hf_named_tokens(model: Path) -> dict[str, int]:
    """tokenizer_config.json's bos_token/eos_token as ids of the tokenizer.json beside it."""
    file = model / "tokenizer.json" if model.is_dir() else model
    config_file = file.parent / "tokenizer_config.json"
    if not config_file.is_file():
        return {}
    from tokenizers import Tokenizer

    config = json.loads(config_file.read_text(encoding="utf-8"))
    vocab = Tokenizer.from_file(str(file)).get_vocab(with_added_tokens=True)
    ids = {}
    for key in ("bos_token", "eos_token"):
        token = config.get(key)
        token = token.get("content") if isinstance(token, dict) else token
        if isinstance(token, str) and token in vocab:
            ids[key] = vocab[token]
    return ids
