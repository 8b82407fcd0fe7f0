"""Two gloo ranks saving step 4 over a step symlink (test_linked_steps): argv[1] is a JSON list of
[checkpoints root, async_save]."""

import datetime
import json
import sys
import warnings
from pathlib import Path

import torch
import torch.distributed as dist
from gloo_worker import run_as_rank

from gptrain.checkpoint.manager import CheckpointManager


def main() -> int:
    warnings.filterwarnings("ignore")
    torch.set_num_threads(1)
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=30))
    for root, async_save in json.loads(sys.argv[1]):
        manager = CheckpointManager(Path(root), keep_last=-1, rank=dist.get_rank(), async_save=async_save)
        manager.save(4, {"model": {"w": torch.full((4,), 9.0)}}, {"rng": torch.tensor([dist.get_rank()])})
        manager.close()
    return 0


if __name__ == "__main__":
    run_as_rank(main)
