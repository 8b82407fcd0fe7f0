"""One gloo rank claiming a results directory with move_aside (tests/reliability/test_run_lock.py):
writes the notes its lock holds to <out>/notes-<rank>.json."""

import json
import os
import sys
from pathlib import Path

import torch.distributed as dist

from gptrain.train.run_directory import claim_run_directory

rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
dist.init_process_group("gloo")
lock = claim_run_directory(Path(sys.argv[1]), rank, world, resume=False, move_aside=True)
Path(sys.argv[2], f"notes-{rank}.json").write_text(json.dumps(lock.notes))
lock.release()
dist.barrier()
dist.destroy_process_group()
