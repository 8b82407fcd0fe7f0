"""Expected rates of a cluster profile: the `validation:` block of configs/cluster/<name>.yaml.

A profile is a cluster file name (`aws_p5`, `aws_p5.yaml`, `cluster=aws_p5`), a path to such a file,
or a launch stage's resolved config (which carries the block under `validation.thresholds`). The
cluster files are named here for `gptrain plan --cluster` too (cluster_profile_path). Every number in the
shipped files names its public source in a comment; `--min-busbw-GBps` overrides the
large-message bus bandwidth threshold.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from gptrain.config.nemo_launcher import read_slurm_launcher_keys
from gptrain.config.yamlio import load_file
from gptrain.errors import ConfigError
from gptrain.launch.cluster_profiles import cluster_profile_path
from gptrain.launch.sbatch_directives import node_gpus
from gptrain.launch.sections import check_cluster_file_keys
from gptrain.validate.bandwidth import parse_bytes

DEFAULT_SLOW_PCT = 10.0
DEFAULT_LARGE_BYTES = 1 << 30


@dataclass(frozen=True)
class Thresholds:
    """What counts as healthy. None: no absolute check, only the comparison with the median."""

    profile: str | None = None
    large_message_bytes: int = DEFAULT_LARGE_BYTES
    """all_reduce sizes from this one on are 'large'; their best busbw is checked."""
    intra_node_busbw_GBps: float | None = None
    """all_reduce busbw expected at large sizes when the world is one node (NVLink)."""
    inter_node_busbw_GBps: float | None = None
    """all_reduce busbw expected at large sizes when the world spans nodes (the network)."""
    matmul_tflops: float | None = None
    """bf16 matmul rate every GPU should reach."""
    copy_GBps: float | None = None
    """device-memory copy bandwidth (read + write) every GPU should reach."""
    slow_pct: float = DEFAULT_SLOW_PCT
    """a GPU, rank or node this many percent below the median of its peers is flagged."""
    min_busbw_override: float | None = None
    gpus_per_node: int | None = None
    """the cluster file's gpus_per_node (else its gres's): the node the inter-node threshold is set
    for (all its NICs)."""

    def busbw_threshold(self, multi_node: bool) -> float | None:
        if self.min_busbw_override is not None:
            return self.min_busbw_override
        return self.inter_node_busbw_GBps if multi_node else self.intra_node_busbw_GBps

    def holds_at(self, nbytes: int) -> bool:
        """Whether the busbw threshold speaks for a message of `nbytes`: a profile's is set for
        large messages (busbw climbs with the size: 64 MiB on 8 H100s is far below 1 GiB's), and
        --min-busbw-GBps is taken as given at any size."""
        return self.min_busbw_override is not None or nbytes >= self.large_message_bytes

    def partial_node_share(self, ranks_per_node: int) -> float:
        """The share of a node's network that `ranks_per_node` ranks drive: the inter-node threshold is
        a whole node's (every GPU with its own NICs, as on p5/ND); a validation with fewer ranks a
        node (`srun -N2 -n2`) moves data through that many GPUs' NICs only. 1 where unknown."""
        if (
            self.min_busbw_override is not None
            or not self.gpus_per_node
            or ranks_per_node >= self.gpus_per_node
        ):
            return 1.0
        return ranks_per_node / self.gpus_per_node


def _block(data: Any, path: Path) -> dict[str, Any]:
    """The thresholds block of a cluster file or of a validation stage's resolved config."""
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a YAML mapping")
    if isinstance(data.get("thresholds"), dict):  # a validation stage's resolved config
        return data["thresholds"]
    # a threshold beside validation: or a misspelt validation: left the profile without thresholds
    check_cluster_file_keys(data, path, "validation", threshold_keys())
    block = data.get("validation", {})
    if isinstance(block, dict) and isinstance(block.get("thresholds"), dict):
        beside = sorted(str(key) for key in block if key != "thresholds")
        if beside:  # read from validation.thresholds alone, a threshold beside it was dropped unseen
            raise ConfigError(
                f"{path}: validation.{beside[0]} is beside validation.thresholds, where the thresholds are"
                f" read from then; move it under thresholds (validation.thresholds.{beside[0]})"
            )
        block = block["thresholds"]
    if block is None:
        return {}
    if not isinstance(block, dict):
        raise ConfigError(f"{path}: 'validation' must be a mapping of thresholds")
    return block


def load_thresholds(profile: str | None, min_busbw_GBps: float | None = None) -> Thresholds:
    """Thresholds of `profile` (None: relative checks only), with the CLI override applied."""
    if profile is None:
        return Thresholds(min_busbw_override=min_busbw_GBps)
    path = cluster_profile_path(profile)  # a malformed file below: one line naming it
    data = load_file(path) or {}
    read_slurm_launcher_keys(data, f"{path}: ")  # NeMo's num_gpus is its gpus_per_node
    block = _block(data, path)
    values = threshold_values(block, f"{path}: ")
    return Thresholds(
        profile=str(profile),
        min_busbw_override=min_busbw_GBps,
        gpus_per_node=node_gpus(data, f"{path}: "),
        **values,
    )


def threshold_values(block: dict[str, Any], where: str, prefix: str = "validation.") -> dict[str, Any]:
    """The numbers of a thresholds block by field; an unknown key or a value that is no number is
    a ConfigError that starts with `where` and names the key as `<prefix><key>`."""
    known = threshold_keys()
    values: dict[str, Any] = {}
    for key, value in block.items():
        if key not in known:
            raise ConfigError(f"{where}unknown key {prefix}{key}; known: {', '.join(sorted(known))}")
        if value is None:
            continue
        values[key] = _number(key, value, f"{where}{prefix}{key}")
        out_of_range = _out_of_range(key, values[key])
        if out_of_range:
            raise ConfigError(f"{where}{prefix}{key} must be {out_of_range}, got {value!r}")
    return values


def _number(key: str, value: Any, name: str) -> float:
    """A threshold's value as a number; `true` is no rate (YAML's yes/on read as 1.0 set a 1 GB/s
    floor, or flagged GPUs 1% below the median), and a message size is read as the CLI's size
    options read theirs (`1GiB`, `512M`, a whole number of bytes)."""
    not_a_number = ConfigError(f"{name} must be a number, got {value!r}")
    if isinstance(value, bool):
        raise not_a_number
    if key == "large_message_bytes":
        return _size(value, name)
    try:
        return float(value)
    except (TypeError, ValueError, OverflowError):
        raise not_a_number from None


def _size(value: Any, name: str) -> int:
    """A message size as `--max-bytes` reads it, with its error after the key's name."""
    text = value if isinstance(value, str) else repr(value)  # YAML's 1.0e9 -> '1000000000.0', .inf -> 'inf'
    try:
        return parse_bytes(text)
    except ValueError as error:
        raise ConfigError(f"{name}: {error}") from None


def threshold_keys() -> set[str]:
    """The keys of a thresholds block: the fields of Thresholds a profile sets."""
    return {f.name for f in fields(Thresholds)} - {"profile", "min_busbw_override", "gpus_per_node"}


def _out_of_range(key: str, value: float) -> str | None:
    """What `value` must be, where it is not: a 0, negative or nan rate turns its check off silently
    (nothing compares below it), an infinite one fails every node (and is no JSON number), and a
    slow_pct of 0 or 100 or more flags every GPU or none."""
    if key == "slow_pct":
        return None if 0 < value < 100 else "a percentage between 0 and 100"
    return None if 0 < value < math.inf else "a positive finite number"  # nan is not > 0
