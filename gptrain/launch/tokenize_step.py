"""The `gptrain data prepare` command that tokenizes one shard, and the data prefix it writes."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from gptrain.launch.key_types import switch_of
from gptrain.launch.shards import Shard


def tokenize_command(cfg: dict[str, Any], source: Path, prefix: Path, python: str) -> list[str]:
    tokenizer = cfg.get("tokenizer") or {}
    command = [
        python,
        "-m",
        "gptrain",
        "data",
        "prepare",
        "--input",
        str(source),
        "--output-prefix",
        str(prefix),
    ]
    command += ["--tokenizer-type", str(tokenizer.get("type", "GPT2BPETokenizer"))]
    for key, flag in (
        ("vocab_file", "--vocab-file"),
        ("merge_file", "--merge-file"),
        ("model", "--tokenizer-model"),
    ):
        if tokenizer.get(key):
            command += [flag, str(tokenizer[key])]
    command += tiktoken_flags(tokenizer)
    command += ["--json-keys", json_key(cfg)]
    if switch_of(cfg, "append_eod", True, "data_preparation"):
        command.append("--append-eod")
    return command + ["--workers", str(worker_count(cfg.get("workers")))]


def tiktoken_flags(tokenizer: dict[str, Any]) -> list[str]:
    """The TikTokenizer settings of a Megatron tiktoken vocabulary file, as data prepare's flags."""
    flags = []
    for key, flag in (
        ("vocab_size", "--vocab-size"),
        ("tiktoken_pattern", "--tiktoken-pattern"),
        ("tiktoken_num_special_tokens", "--tiktoken-num-special-tokens"),
    ):
        if tokenizer.get(key) is not None:
            flags.append(f"{flag}={tokenizer[key]}")
    if tokenizer.get("special_tokens"):
        flags += ["--tokenizer-special-tokens", *(str(token) for token in tokenizer["special_tokens"])]
    return flags


def worker_count(value: Any) -> int:
    """data_preparation.workers on the node that tokenizes: `auto` is every CPU this task may use."""
    if str(value).strip().lower() == "auto":
        return max(
            1, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
        )
    return int(value or 1)


def json_key(cfg: dict[str, Any]) -> str:
    return str(cfg.get("json_key") or "text")


def tokenize_prefix(cfg: dict[str, Any], shard: Shard) -> Path:
    """`gptrain data prepare`'s --output-prefix for a shard (it appends _<json key>_document)."""
    name_prefix = str(cfg.get("output_name_prefix") or "")  # NeMo's Pile: my-gpt3_00
    return Path(cfg["output_dir"]) / f"{name_prefix}{shard.stem}"


def output_prefix(cfg: dict[str, Any], shard: Shard) -> Path:
    """The Megatron data prefix a shard becomes (what training's data_prefix lists)."""
    return Path(f"{tokenize_prefix(cfg, shard)}_{json_key(cfg)}_document")
