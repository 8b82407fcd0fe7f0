"""A rank's extra state in a checkpoint (rank_<r>.pt: RNG streams, data order): written, and read back."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import torch

from gptrain.checkpoint.integrity import recorded_world_size


def read_rank_state(path: Path, rank: int, world: int | None = None) -> dict[str, Any]:
    """This rank's extra state of a checkpoint ({} when it has none: an import). A rank of a larger
    world than saved it reads rank 0's: its run-wide records (the data order a resume compares) are
    every rank's, and the last rank, which prints the console's lines, is a new one whenever the
    world grows. A rank of the world that saved it without its own file (damage, or a checkpoint from
    before manifests) gets nothing, as before rank 0's file was shared.

    Its random streams (`rng`) are those of its own file where `world` (this run's ranks; None: not
    known, as in one process) is the world that saved it. Under another world they are the streams
    the saved rank at this rank's (pipeline, tensor) position with data-parallel rank 0 saved, as
    Megatron restores the same (pp, tp) rank's after a change of the data-parallel size: the
    data-parallel ranks of one position share one seed and draw alike (gptrain.parallel.rng), and
    rank r of another world is in general another position's. That assumes the TP and PP sizes that
    saved them; where they differ, gptrain.train.state.restore_rng_state refuses the streams, by the
    `rng_layout` every rank keeps."""
    return rank_state_from(path, rank, rank_file_read(path, rank), world)


def rank_state_from(path: Path, rank: int, source: Path | None, world: int | None = None) -> dict[str, Any]:
    """`read_rank_state` from `source`, the file `rank_file_read` found."""
    if source is None:
        return {}
    state = torch.load(source, map_location="cpu", weights_only=False)
    saved_world = _saved_world_size(path, state)
    own = source.name == f"rank_{rank}.pt"
    if own and (world is None or saved_world in (None, world)):
        return state
    if not own and (saved_world is None or rank < saved_world):
        return {}
    records = {key: value for key, value in state.items() if key != "rng"}
    position = stream_rank(state.get("rng_layout"), rank, world)
    if position is not None:
        stream = path / f"rank_{position}.pt"
        rng = state.get("rng") if stream == source else _streams_of(stream)
        if rng is not None:
            records["rng"] = rng
    return records


def stream_rank(saved_layout: Any, rank: int, world: int | None) -> int | None:
    """The saved rank whose streams `rank` of a `world`-rank run takes: the same (pipeline, tensor)
    position, data-parallel rank 0, on the pp x dp x tp mesh of the TP and PP sizes `saved_layout`
    records (tp fastest: gptrain.parallel.rng.model_parallel_ranks); rank 0's for one process. None
    where the layout is not recorded or does not divide either world."""
    if world == 1:
        return 0
    if not isinstance(saved_layout, dict) or world is None:
        return None
    saved_world = saved_layout.get("world_size")
    tp = saved_layout.get("tensor_model_parallel_size")
    pp = saved_layout.get("pipeline_model_parallel_size")
    if not all(isinstance(n, int) and n > 0 for n in (saved_world, tp, pp)):
        return None
    if saved_world % (tp * pp) or world % (tp * pp):
        return None
    return rank // (world // pp) * (saved_world // pp) + rank % tp


def _streams_of(file: Path) -> Any:
    """The `rng` of rank file `file`; None where it has no such file."""
    if not file.is_file():
        return None
    return torch.load(file, map_location="cpu", weights_only=False).get("rng")


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
