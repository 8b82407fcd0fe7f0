"""One gloo rank for tests/train/test_save_allowance.py: a state of a size that differs by rank (rank r
holds (r + 1) x 2M float32 and as many float64), its bytes and the allowance of three saves in a row,
with the collectives they made, to OUT/rank_<r>.json. Argument: OUT."""

import datetime
import json
import os
import sys
from pathlib import Path
from types import SimpleNamespace

import torch
import torch.distributed as dist

from gptrain.train import saving
from gptrain.train.watchdog import Watchdog

ELEMENTS = 2_000_000


def main() -> None:
    out = Path(sys.argv[1])
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    rank, world = dist.get_rank(), dist.get_world_size()
    count = (rank + 1) * ELEMENTS
    state = {"model": {"w": torch.zeros(count)}, "optimizer": [torch.zeros(count, dtype=torch.float64)]}
    s = SimpleNamespace(
        cfg=SimpleNamespace(trainer=SimpleNamespace(hang_timeout_minutes=0.001)),
        watchdog=Watchdog(rank, world, 0.0),
        state=SimpleNamespace(step=4),
        device=torch.device("cpu"),
        save_bytes=None,
    )
    calls = []
    all_reduce = dist.all_reduce

    def counted(*args, **kwargs):
        calls.append(kwargs.get("op"))
        return all_reduce(*args, **kwargs)

    dist.all_reduce = counted
    allowances = [saving.save_allowance(s, state) for _ in range(3)]
    dist.all_reduce = all_reduce
    dist.barrier()  # every rank made the same number of collectives, or this hangs
    dist.destroy_process_group()
    result = {"bytes": saving.state_bytes(state), "allowances": allowances, "collectives": len(calls)}
    (out / f"rank_{rank}.json").write_text(json.dumps(result))


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
