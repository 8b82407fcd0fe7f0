"""Data preparation stage: download shards, extract, tokenize, write the blend.

Every step is skipped when its output exists, so a rerun or a requeued array task only does
what is missing. Downloads: resumable_download.py; extraction: extraction.py; the tokenize
command: tokenize_step.py; the blend: data_blend.py.

Standard library only (urllib, lzma, gzip) plus zstandard: no torch, no numpy.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

from gptrain.errors import ConfigError, DataError, GptrainError, os_error_text
from gptrain.launch.data_blend import apply_blend, write_blend
from gptrain.launch.extraction import extract, strip_compression
from gptrain.launch.key_types import switch_of
from gptrain.launch.resumable_download import download, remove_part
from gptrain.launch.shards import Shard, parse_shards
from gptrain.launch.tokenize_step import output_prefix, tokenize_command, tokenize_prefix
from gptrain.utils.atomic import temporary_sibling

TOKENIZER_URLS = {"vocab_file": "vocab_url", "merge_file": "merge_url"}


def tokenizer_downloads(cfg: dict[str, Any]) -> dict[str, str]:
    """{tokenizer file path: URL} of the stage's tokenizer files that have a URL to fetch them from."""
    tokenizer = cfg.get("tokenizer") or {}
    return {
        str(tokenizer[key]): str(tokenizer[url])
        for key, url in TOKENIZER_URLS.items()
        if tokenizer.get(key) and tokenizer.get(url)
    }


def fetch_tokenizer_files(cfg: dict[str, Any]) -> None:
    """Fetch the tokenizer files that are missing and have a URL (NeMo's download_vocab_url and
    download_merges_url). Every array task may do it at once: each writes its own part file and
    renames it into place, so a reader sees a whole file or none. The part's name is made by
    O_EXCL creation: a process id (the name before) repeats across nodes, and two tasks of one
    id on one shared folder wrote the same part, one resuming the other's bytes."""
    for path, url in tokenizer_downloads(cfg).items():
        dest = Path(path)
        if not dest.exists():
            dest.parent.mkdir(parents=True, exist_ok=True)
            part = temporary_sibling(dest)
            try:
                download(Shard(url), dest, *retry_settings(cfg), part=part)
            finally:
                remove_part(part)  # a failed attempt's: not resumed, since no other run finds it


def retry_settings(cfg: dict[str, Any]) -> tuple[int, float, float]:
    """(retries, backoff_seconds, timeout_seconds), checked at launch (gptrain.launch.sections);
    null, which the launch lets through, is the default, as the stage's config file's comments say."""
    values = [cfg.get(key) for key in ("retries", "backoff_seconds", "timeout_seconds")]
    retries, backoff, timeout = (d if v is None else v for v, d in zip(values, (5, 2.0, 60.0), strict=True))
    return int(retries), float(backoff), float(timeout)


def prepare_shard(cfg: dict[str, Any], index: int, python: str = sys.executable) -> Path:
    """Download, extract and tokenize shard `index`; return its data prefix."""
    shards = parse_shards(cfg.get("shards") or [])
    if not 0 <= index < len(shards):
        raise ConfigError(f"shard index {index} out of range: data_preparation.shards has {len(shards)}")
    shard = shards[index]
    prefix = output_prefix(cfg, shard)
    raw = Path(cfg["download_dir"]) / shard.filename
    plain = raw.with_name(strip_compression(shard.filename))
    if Path(f"{prefix}.bin").exists() and Path(f"{prefix}.idx").exists():
        print(f"gptrain: {prefix}.bin/.idx exist; shard {index} already prepared", file=sys.stderr)
        remove_extracted(cfg, raw, plain)  # a task ended between its tokenizing and the removal
        return prefix
    if not plain.exists() or plain == raw:
        raw = download(shard, raw, *retry_settings(cfg))
        keep = switch_of(cfg, "keep_compressed", False, "data_preparation")
        plain = extract(raw, keep=keep) if switch_of(cfg, "extract", True, "data_preparation") else raw
        if plain != raw and not switch_of(cfg, "keep_extracted", True, "data_preparation"):
            extracted_mark(plain).touch()  # this stage's to remove once tokenized, in this task or a rerun
    refuse_empty_text(plain, index, shard)
    prefix.parent.mkdir(parents=True, exist_ok=True)
    command = tokenize_command(cfg, plain, tokenize_prefix(cfg, shard), python)
    print("gptrain: " + " ".join(command), file=sys.stderr, flush=True)
    if subprocess.run(command).returncode != 0:
        raise DataError(f"tokenizing {plain} failed (see the messages above)")
    remove_extracted(cfg, raw, plain)
    return prefix


def refuse_empty_text(plain: Path, index: int, shard: Shard) -> None:
    """An empty shard text (its data lost in a crash after its rename) tokenized to 0 documents with
    exit 0: a whole shard silently out of the blend."""
    if plain.stat().st_size == 0:
        raise DataError(
            f"{plain}: empty, where shard {index}'s text should be ({shard.url}): cut by a crash while it "
            "was written? delete it, and the next run fetches it again"
        )


def extracted_mark(plain: Path) -> Path:
    """The empty file beside a shard's text that says the stage extracted it to remove: only such text
    is removed, never a file a user placed (or an earlier run kept) under the same name."""
    return plain.with_name(plain.name + ".gptrain-extracted")


def remove_extracted(cfg: dict[str, Any], raw: Path, plain: Path) -> None:
    """Remove the text the stage extracted from a shard's archive, once tokenized (NeMo's rm_extracted:
    about 28 GB a Pile shard), unless keep_extracted; text the stage did not extract is never removed."""
    mark = extracted_mark(plain)
    if plain == raw or switch_of(cfg, "keep_extracted", True, "data_preparation") or not mark.exists():
        return
    plain.unlink(missing_ok=True)
    mark.unlink(missing_ok=True)
    print(
        f"gptrain: removed {plain}, extracted from {raw.name} and tokenized "
        "(data_preparation.keep_extracted=true keeps it)",
        file=sys.stderr,
    )


def load_stage_config(path: str) -> dict[str, Any]:
    try:
        return yaml.safe_load(Path(path).read_text())
    except OSError as error:
        raise ConfigError(f"cannot read {path}: {error.strerror}") from None


def main(argv: list[str] | None = None) -> int:
    """Entry point of the stage's jobs: `shard` (one array task), `all` (local), `apply-blend`."""
    parser = argparse.ArgumentParser(prog="python -m gptrain.launch.download")
    parser.add_argument("action", choices=("shard", "all", "blend", "apply-blend"))
    parser.add_argument("--config", required=True, help="resolved stage config (data prep or training)")
    parser.add_argument("--index", type=int, default=None, help="shard index (array task id)")
    parser.add_argument(
        "--stride",
        type=int,
        default=None,
        help="array tasks: this one prepares shards index, index + stride, ...",
    )
    parser.add_argument("--blend", default=None, help="blend file for apply-blend")
    parser.add_argument(
        "--frozen", default=None, help="apply-blend: the run dir's copy of the blend a requeue reads"
    )
    args = parser.parse_args(argv)
    try:
        if args.action == "apply-blend":
            frozen = Path(args.frozen) if args.frozen else None
            apply_blend(Path(args.blend), Path(args.config), frozen, os.environ.get("SLURM_JOB_ID", ""))
            return 0
        cfg = load_stage_config(args.config)
        indices = task_shards(cfg, args.index, args.stride) if args.action == "shard" else []
        if args.action == "all":
            indices = list(range(len(cfg.get("shards") or [])))
        if indices:
            fetch_tokenizer_files(cfg)
        prepare_shards(cfg, indices)
        if args.action != "shard" or all_prepared(cfg):
            print(f"gptrain: blend written to {write_blend(cfg)}", file=sys.stderr)
    except GptrainError as error:
        print(f"gptrain: error: {error}", file=sys.stderr)
        return 1
    except OSError as error:  # a tokenizer folder or the blend's that cannot be made or written
        print(f"gptrain: error: {os_error_text(error, args.config)}", file=sys.stderr)
        return 1
    return 0


def prepare_shards(cfg: dict[str, Any], indices: list[int]) -> None:
    """Prepare each shard; a stage of several (an array task past MaxArraySize, the local stage) goes
    on past one that fails, as array tasks of one shard each do, and fails at the end naming them."""
    failed = []
    for index in indices:
        try:
            prepare_shard_or_say_why(cfg, index)
        except (ConfigError, DataError) as error:
            if len(indices) == 1:
                raise
            print(f"gptrain: error: shard {index}: {error}", file=sys.stderr)
            failed.append(str(index))
    if failed:
        raise DataError(
            f"shard(s) {', '.join(failed)} of this task's {len(indices)} failed (see above); the others are"
            " prepared, and a relaunch prepares only what is missing"
        )


def prepare_shard_or_say_why(cfg: dict[str, Any], index: int) -> Path:
    """`prepare_shard`, a folder it cannot make or write (permissions, a file in the way, a full
    disk) said in one line naming it, where it was a traceback on every array task."""
    try:
        return prepare_shard(cfg, index)
    except OSError as error:
        raise DataError(f"shard {index}: {os_error_text(error, cfg.get('download_dir'))}") from None


def task_shards(cfg: dict[str, Any], index: int | None, stride: int | None) -> list[int]:
    """The shards of one array task: its index, or with a stride (more shards than the cluster's
    MaxArraySize allows tasks) every stride-th shard from it."""
    if index is None:
        raise ConfigError("shard: give --index (the array task id)")
    if stride is None:
        return [index]
    return list(range(index, max(len(cfg.get("shards") or []), index + 1), stride))


def all_prepared(cfg: dict[str, Any]) -> bool:
    return all(Path(f"{output_prefix(cfg, s)}.idx").exists() for s in parse_shards(cfg.get("shards") or []))


if __name__ == "__main__":
    raise SystemExit(main())
