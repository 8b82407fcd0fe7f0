"""A rank's extra state in a checkpoint (rank_<r>.pt: RNG streams, data order): written, and read back."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import torch

from gptrain.checkpoint.integrity import recorded_world_size


def read_rank_state(path: Path, rank: int) -> dict[str, Any]:
    """This rank's extra state of a checkpoint ({} when it has none: an import). A rank of a larger
    world than saved it reads rank 0's: its run-wide records (the data order a resume compares) are
    every rank's, and the last rank, which prints the console's lines, is a new one whenever the
    world grows. Rank 0's streams are not this rank's (tensor ranks must not share one), so they are
    left out; its `rng_layout` stays, for gptrain.train.state.restore_rng_state to say they were not
    restored. A rank of the world that saved it without its own file (damage, or a checkpoint from
    before manifests) gets nothing, as before rank 0's file was shared."""
    return rank_state_from(path, rank, rank_file_read(path, rank))


def rank_state_from(path: Path, rank: int, source: Path | None) -> dict[str, Any]:
    """`read_rank_state` from `source`, the file `rank_file_read` found."""
    if source is None:
        return {}
    state = torch.load(source, map_location="cpu", weights_only=False)
    if source.name == f"rank_{rank}.pt":
        return state
    saved_world = _saved_world_size(path, state)
    if saved_world is None or rank < saved_world:
        return {}
    return {key: value for key, value in state.items() if key != "rng"}


def rank_file_read(path: Path, rank: int) -> Path | None:
    """The rank file `read_rank_state` reads for `rank`: its own, else rank 0's, else none."""
    return next((file for file in (path / f"rank_{rank}.pt", path / "rank_0.pt") if file.is_file()), None)


def _saved_world_size(path: Path, rank_0_state: dict[str, Any]) -> int | None:
    """How many ranks saved checkpoint `path`: the world its streams record, else its manifest's
    rank files; None where neither says."""
    layout = rank_0_state.get("rng_layout")
    world = layout.get("world_size") if isinstance(layout, dict) else None
    return world if isinstance(world, int) else recorded_world_size(path)


def rank_state_bytes(rank_state: dict[str, Any]) -> bytes:
    """`rank_state` as torch.save writes it: taken when the save starts (a background save writes it
    later, with the shards: gptrain.checkpoint.checksum_writer, which records its CRC-32)."""
    buffer = io.BytesIO()
    torch.save(rank_state, buffer)
    return buffer.getvalue()
