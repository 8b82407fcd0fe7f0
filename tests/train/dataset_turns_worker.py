"""One gloo rank for tests/train/test_dataset_turns.py: `build_datasets` with `_build_datasets`
replaced by a recorder. Ranks 0-1 play one node and ranks 2-3 another (local rank = rank % 2).
Each build writes, on entry, which builds had finished (OUT/entered_<r>.json), sleeps so that an
overlapping build would be seen unfinished, then marks itself done (OUT/done_<r>). Arguments:
OUT and the rank whose build fails ("none" for none); each rank writes what it raised to
OUT/raised_<r>.txt."""

import datetime
import json
import sys
import time
from pathlib import Path

import torch.distributed as dist

from gptrain.train import builders

out, failing = Path(sys.argv[1]), sys.argv[2]
dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
rank = dist.get_rank()


def recording_build(cfg, vocab, tokenizer, asked_by=None):
    done = sorted(int(path.name.split("_")[1]) for path in out.glob("done_*"))
    (out / f"entered_{rank}.json").write_text(json.dumps(done))
    time.sleep(0.5)
    if failing == str(rank):
        raise builders.DataError(f"index cache of rank {rank} unwritable")
    (out / f"done_{rank}").touch()
    return ("train", "valid", "test")


builders._build_datasets = recording_build
try:
    built = builders.build_datasets(None, 0, None, local_rank=rank % 2)
    (out / f"raised_{rank}.txt").write_text(f"built {built[0]}")
except builders.DataError as error:
    (out / f"raised_{rank}.txt").write_text(str(error))
dist.destroy_process_group()
