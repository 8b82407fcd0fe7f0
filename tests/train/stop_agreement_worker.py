"""One gloo rank for tests/train/test_stop_agreement.py: three runs of step boundaries through
StopAgreement in one process group; writes, per run, the step each rank stopped at and its reason
to OUT/rank_<r>.json. Argument: OUT."""

import datetime
import json
import os
import sys
from pathlib import Path

import torch.distributed as dist

from gptrain.train.stop_agreement import StopAgreement

# (name, the rank that asks to stop, at which step, which steps are logged)
RUNS = [
    ("unlogged request", 1, 2, {1, 5}),
    ("logged request", 0, 5, {1, 5}),
    ("request at a boundary after an unlogged one", 1, 3, {1, 4}),
    ("no request", None, None, {1, 5}),
]


def stop_step(agreement: StopAgreement, rank: int, asker: int | None, at: int | None, logged: set[int]):
    for step in range(1, 9):
        asked = "received SIGUSR1" if rank == asker and at is not None and step >= at else None
        reason = agreement.exchange(asked, step in logged)
        if reason is not None:
            return step, reason
    return None, None


def main() -> None:
    out = Path(sys.argv[1])
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    rank = dist.get_rank()
    results = {name: stop_step(StopAgreement(), rank, asker, at, logged) for name, asker, at, logged in RUNS}
    dist.barrier()  # every rank made the same number of collectives, or this hangs
    dist.destroy_process_group()
    (out / f"rank_{rank}.json").write_text(json.dumps(results))


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
