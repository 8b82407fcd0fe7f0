"""One gloo rank for tests/checkpoint/test_checkpoint_ranks.py (one process group, one start-up):
save step_2, 4 and 6; rank 0 damages rank 1's file of step_6 and of step_4; resume as a requeued
job would, meet the other rank in one all_reduce (the first collective of training) and write
what was loaded to OUT/rank_<r>.json. Arguments: ROOT OUT."""

import datetime
import json
import os
import sys
import traceback
import warnings
from pathlib import Path

import torch
import torch.distributed as dist

from gptrain.checkpoint.manager import CheckpointManager


def state(value: float) -> dict:
    return {"model": {"w": torch.full((4,), value)}}


def change_first_bytes(path: Path) -> None:
    """Same size, but torch.load no longer reads it (the zip header is gone)."""
    data = path.read_bytes()
    path.write_bytes(b"XXXX" + data[4:])


def forget_crc(step_dir: Path, name: str) -> None:
    """As in a checkpoint written before rank files had a CRC-32: only loading finds the damage."""
    record = json.loads((step_dir / "COMPLETE").read_text())
    record["files"][name]["crc32"] = None
    (step_dir / "COMPLETE").write_text(json.dumps(record))


def damage(root: Path) -> None:
    change_first_bytes(root / "step_6" / "rank_1.pt")  # its CRC-32 finds it before loading
    change_first_bytes(root / "step_4" / "rank_1.pt")  # fails to load on rank 1 only
    forget_crc(root / "step_4", "rank_1.pt")


def resume(root: Path, out: Path) -> None:
    manager = CheckpointManager(root, keep_last=5, rank=dist.get_rank())
    target, seen = state(0.0), []
    path, extra = manager.load_newest_good(lambda saved: target, lambda loaded: None, seen.append)
    ranks = torch.ones(1)
    dist.all_reduce(ranks)
    result = {"resumed": path.name, "w": target["model"]["w"].tolist(), "extra": extra, "warnings": seen}
    (out / f"rank_{manager.rank}.json").write_text(json.dumps({**result, "ranks": ranks.item()}))


def main() -> int:
    warnings.filterwarnings("ignore")
    torch.set_num_threads(1)
    # a rank waiting in a collective its peer never enters fails here, well within the test's timeout
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=30))
    root, out, rank = Path(sys.argv[1]), Path(sys.argv[2]), dist.get_rank()
    first_run = CheckpointManager(root, keep_last=5, rank=rank)
    for step in (2, 4, 6):
        first_run.save(step, state(float(step)), {"step": step, "rank": rank})
    if rank == 0:
        damage(root)
    dist.barrier()
    resume(root, out)
    dist.barrier()
    return 0


if __name__ == "__main__":
    code = 1
    try:
        code = main()
    except BaseException:
        traceback.print_exc()
    finally:  # /work/shared/torch-distributed-cpu.md: gloo may abort at interpreter exit otherwise
        if dist.is_initialized():
            dist.destroy_process_group()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
