"""The manifest rank 0 writes into a save's COMPLETE (every rank's files, by name), or why it cannot."""

from __future__ import annotations

import json
from pathlib import Path

import torch.distributed as dist

from gptrain.checkpoint.agreement import is_distributed
from gptrain.checkpoint.checksum_writer import gathered_checksums, sidecar_name
from gptrain.checkpoint.integrity import manifest_by_name


def saving_world_size() -> int:
    return dist.get_world_size() if is_distributed() else 1


def complete_manifest(
    step_dir: Path, own: dict[str, str | None], world_size: int
) -> tuple[dict[str, str | None], dict[str, dict], list[str]]:
    """(every file's CRC-32, the manifest, the files rank 0 cannot find): every rank's checksum sidecar
    and the files each lists (its rank file included), looked up by name with one stat a file. A file
    not found is on storage rank 0 does not share (CheckpointNotSharedError)."""
    checksums = gathered_checksums(step_dir, own, world_size)
    names = [sidecar_name(rank) for rank in range(world_size)] + list(checksums)
    files, unseen = manifest_by_name(step_dir, names, checksums)
    return checksums, files, unseen


def not_shared_text(step_dir: Path, unseen: list[str]) -> str:
    """The one line for a save whose files rank 0 cannot see (CheckpointNotSharedError)."""
    names = ", ".join(unseen[:3]) + (f" and {len(unseen) - 3} more" if len(unseen) > 3 else "")
    return (
        f"checkpoint {step_dir} was not marked complete: rank 0 cannot see files other ranks wrote into "
        f"it ({names}), so {step_dir.parent} is not one directory every rank shares (node-local "
        "storage such as /tmp or /raid under the same path on each node); set exp_manager.explicit_log_dir "
        "(or base_results_dir) to a file system every node mounts"
    )


def recorded_bytes(record: str) -> int:
    """The size of a checkpoint from the text of its COMPLETE marker, the marker included."""
    files = json.loads(record)["files"]
    return sum(entry["bytes"] for entry in files.values()) + len(record.encode())
