"""Four gloo ranks for tests/checkpoint/test_checkpoint_at_scale.py: the file descriptors each holds
after making CheckpointManager's background-save group, after one background save over it, and
for a plain (eagerly connected) gloo group made after it. Prints one JSON line from rank 0.
Argument: a free port."""

import json
import os
import sys
import tempfile
import warnings
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from gptrain.checkpoint.manager import CheckpointManager

WORLD = 4


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def rank_main(rank: int, port: int, root: str) -> None:
    warnings.filterwarnings("ignore")
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=WORLD,
        timeout=timedelta(seconds=60),
    )
    before = open_fds()
    manager = CheckpointManager(root, keep_last=1, rank=rank, async_save=True)
    created = open_fds() - before
    manager.save(1, {"model": {f"w{rank}": torch.full((4,), float(rank))}}, {})
    manager.close()
    dist.barrier()
    saved = open_fds() - before
    dist.new_group(backend="gloo")
    eager = open_fds() - before - saved
    counts: list = [None] * WORLD
    lazy_left_set = "TORCH_GLOO_LAZY_INIT" in os.environ
    dist.all_gather_object(counts, (created, saved, eager, lazy_left_set))
    if rank == 0:
        print(json.dumps(counts), flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    mp.spawn(rank_main, args=(int(sys.argv[1]), tempfile.mkdtemp()), nprocs=WORLD)
