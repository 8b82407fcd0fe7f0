"""What a container job mounts: the directories the launch wrote for it, then the user's mounts.

A job in a pyxis container sees only what `--container-mounts` brings in. Every job reads its
resolved config and writes logs and checkpoints under `base_results_dir`, reads data and the
tokenizer under `data_dir` (data preparation writes there) and, with `--config-dir`, may name files
of that tree; so, as the NeMo launcher does, these are mounted at the same path inside the
container, ahead of `container_mounts` (so that a user's mount nested inside one still lands on
top). One already visible through a user's mount (the same path, or inside a `src:src` mount) or
whose path a user's mount takes is left out.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gptrain.errors import ConfigError
from gptrain.launch.compose import CONFIG_ROOT


@dataclass
class Mounts:
    """`--container-mounts` items in order, and the host directories gptrain added (the launch
    creates them: pyxis cannot mount a source that does not exist)."""

    items: list[str] = field(default_factory=list)
    added: list[str] = field(default_factory=list)


def job_dirs(resolved: dict[str, Any], config_root: Path) -> list[tuple[str, str]]:
    """(key, absolute path) of each directory a job of this launch reads or writes."""
    dirs = [(key, resolved.get(key)) for key in ("base_results_dir", "data_dir")]
    if config_root != CONFIG_ROOT:
        dirs.append(("--config-dir", str(config_root)))
    return [(key, os.path.abspath(str(path))) for key, path in dirs if path]


def parse_mount(text: str) -> tuple[str, str]:
    """pyxis's `SRC[:DST[:FLAGS]]` -> (src, dst); a lone SRC is mounted at the same path."""
    parts = text.split(":")
    return os.path.normpath(parts[0]), os.path.normpath(parts[1] if len(parts) > 1 else parts[0])


def is_visible(path: str, mounts: list[tuple[str, str]]) -> bool:
    """Already at `path` in the container, or `path` taken by a mount of something else."""
    for src, dst in mounts:
        if dst == path or (src == dst and (path + "/").startswith(src.rstrip("/") + "/")):
            return True
    return False


def container_mounts(resolved: dict[str, Any], config_root: Path) -> Mounts:
    """gptrain's directories (base_results_dir, data_dir, the conf tree; deduplicated) followed by
    `container_mounts` as given."""
    user = [str(item) for item in resolved.get("container_mounts") or []]
    given = [parse_mount(m) for item in user for m in item.split(",") if m]
    ours = job_dirs(resolved, config_root)
    mounts = Mounts()
    for index, (key, path) in enumerate(ours):
        if "," in path or ":" in path:
            raise ConfigError(
                f"{key}: {path!r} cannot be mounted into the container: pyxis --container-mounts"
                " reads ',' between mounts and ':' between source and destination; use a path without them"
            )
        # another of ours that holds this one (or is the same and comes first) brings it in already
        other = [(p, p) for i, (_, p) in enumerate(ours) if p != path or i < index]
        if not is_visible(path, given + other):
            mounts.added.append(path)
    mounts.items = [f"{path}:{path}" for path in mounts.added] + user
    return mounts
