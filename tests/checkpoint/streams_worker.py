"""One gloo rank for tests/checkpoint/test_checkpoint_ranks.py: a run of 2 ranks resuming ROOT's
checkpoint, saved by one process (the same TP and PP, another data-parallel size), restores the
random streams as the resume does, then draws from each; writes OUT/streams_rank_<r>.json.
`scenario` runs inside a process group already started (checkpoint_ranks_worker.py)."""

import json
import random
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

from gptrain.checkpoint.manager import CheckpointManager
from gptrain.train.state import restore_rng_state

LAYOUT_OF_2 = {
    "world_size": 2,
    "tensor_model_parallel_size": 1,
    "pipeline_model_parallel_size": 1,
    "sequence_parallel": False,
}


def draws() -> dict:
    return {"torch": torch.rand(4).tolist(), "python": random.random(), "numpy": float(np.random.rand())}


def scenario(root: Path, out: Path, mode: str = "dp") -> None:
    rank = dist.get_rank()
    random.seed(99 + rank)  # the streams this rank has before the resume: seeded, not the saved ones
    np.random.seed(99 + rank)
    torch.manual_seed(99 + rank)
    manager = CheckpointManager(root, keep_last=-1, rank=rank)
    lines: list[str] = []
    path, extra = manager.load_newest_good(
        lambda saved: {"model": {"w": torch.zeros(2)}}, lambda state: None, lines.append
    )
    restored = restore_rng_state(extra, LAYOUT_OF_2, lines.append)
    result = {"resumed": path.name, "restored": restored, "lines": lines, "draws": draws()}
    (out / f"streams_rank_{rank}.json").write_text(json.dumps(result))
