"""The stage's blend file from its prepared shards, and the training config pointed at it.

The blend (`blend.file`) lists `data_prefix: [w1, prefix1, w2, prefix2, ...]`; with
`weights: tokens` each weight is the shard's token count (Megatron normalises weights, so
every token is sampled equally often); with `weights: equal` every shard weighs 1.0.
"""

from __future__ import annotations

import array
import struct
import sys
from pathlib import Path
from typing import Any

import yaml

from gptrain.config.yamlio import dump_config
from gptrain.errors import DataError
from gptrain.launch.key_types import blend_weights
from gptrain.launch.shards import parse_shards
from gptrain.launch.tokenize_step import json_key, output_prefix
from gptrain.utils.atomic import atomic_write_text

IDX_MAGIC = b"MMIDIDX\x00\x00"


def count_tokens(prefix: Path) -> int:
    """Tokens in a Megatron indexed dataset: the sum of its sequence lengths (from the .idx)."""
    path = Path(f"{prefix}.idx")
    with open(path, "rb") as handle:
        if handle.read(9) != IDX_MAGIC:
            raise DataError(f"{path}: not a Megatron .idx file (bad magic)")
        try:
            _version, _dtype, count = struct.unpack("<QBQ", handle.read(17))
            handle.read(8)  # document count
            lengths = array.array("i")
            lengths.fromfile(handle, count)
        except (struct.error, EOFError):
            raise DataError(
                f"{path}: ends before its sequence lengths do (a copy cut short?); remove {prefix}.bin/.idx "
                "and run the stage again to prepare that shard anew"
            ) from None
    if sys.byteorder != "little":
        lengths.byteswap()
    return sum(lengths)


def blend_prefixes(cfg: dict[str, Any]) -> list[float | str]:
    """[w1, prefix1, ...] over all shards; every shard must be prepared."""
    mode = (
        blend_weights("data_preparation.blend.weights", (cfg.get("blend") or {}).get("weights")) or "tokens"
    )
    result: list[float | str] = []
    empty: list[Path] = []
    for shard in parse_shards(cfg.get("shards") or []):
        prefix = output_prefix(cfg, shard)
        if not Path(f"{prefix}.idx").exists():
            raise DataError(f"{prefix}.idx missing: shard {shard.url} is not prepared yet")
        tokens = count_tokens(prefix)
        if not tokens:
            empty.append(prefix)
            continue
        result += [float(tokens) if mode == "tokens" else 1.0, str(prefix)]
    leave_out_empty_shards(empty, any_left=bool(result), json_key=json_key(cfg))
    return result


def leave_out_empty_shards(empty: list[Path], any_left: bool, json_key: str) -> None:
    """A shard of no tokens (an empty file, every text empty) went into the blend with weight 0
    (`weights: tokens`), which training refuses as it starts, or 1 (`equal`), a dataset it cannot
    draw one sample from. Such a shard is left out, and named; a blend of nothing is an error."""
    if empty and not any_left:
        raise DataError(
            f"every shard holds no tokens ({empty[0]}.idx and the others); check that the shards' "
            f"records hold their text under data_preparation.json_key ({json_key!r})"
        )
    for prefix in empty:
        print(f"gptrain: warning: {prefix}: holds no tokens; left out of the blend", file=sys.stderr)


def write_blend(cfg: dict[str, Any]) -> Path:
    path = Path(cfg["blend"]["file"])
    atomic_write_text(path, dump_config({"data_prefix": blend_prefixes(cfg)}))
    return path


def read_blend(blend_file: Path) -> Any:
    try:
        return yaml.safe_load(blend_file.read_text())["data_prefix"]
    except (OSError, KeyError, TypeError) as error:
        raise DataError(
            f"{blend_file}: cannot read the blend ({error}); did data preparation finish?"
        ) from None


def frozen_prefixes(blend_file: Path, frozen: Path, job_id: str) -> Any:
    """The blend a Slurm job trains on at every start: the first start (no copy of this job's yet)
    copies `blend_file` to `frozen` in the run dir; a requeue, which runs the batch script again,
    reads that copy, so a later data preparation into the same data_dir does not switch its data."""
    try:
        kept = yaml.safe_load(frozen.read_text()) if job_id else None
    except (OSError, yaml.YAMLError):
        kept = None
    if not isinstance(kept, dict) or str(kept.get("job")) != job_id or "data_prefix" not in kept:
        prefixes = read_blend(blend_file)
        copy = {"job": job_id, "blend": str(blend_file), "data_prefix": prefixes}
        atomic_write_text(frozen, dump_config(copy))
        return prefixes
    try:
        live = yaml.safe_load(blend_file.read_text())["data_prefix"]
    except (OSError, yaml.YAMLError, KeyError, TypeError):
        live = None
    if live != kept["data_prefix"]:
        print(
            f"gptrain: note: the blend {blend_file} differs from {frozen}, the copy job {job_id} took at"
            " its first start; the run keeps that copy's data: launch again (a new job) to train on the new blend",
            file=sys.stderr,
        )
    return kept["data_prefix"]


def apply_blend(blend_file: Path, config_file: Path, frozen: Path | None = None, job_id: str = "") -> None:
    """Point a resolved training config's model.data.data_prefix at the blend (atomically); with
    `frozen`, at the copy of it the job `job_id` took at its first start."""
    prefixes = frozen_prefixes(blend_file, frozen, job_id) if frozen else read_blend(blend_file)
    training = yaml.safe_load(config_file.read_text())
    training.setdefault("model", {}).setdefault("data", {})["data_prefix"] = prefixes
    atomic_write_text(config_file, dump_config(training))
