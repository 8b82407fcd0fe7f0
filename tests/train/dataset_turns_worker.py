"""One gloo rank for tests/train/test_dataset_turns.py: `build_datasets` with `_build_datasets`
replaced by a recorder. Ranks 0-1 play one node and ranks 2-3 another (local rank = rank % 2).
Each build writes, on entry, which builds had finished (OUT/entered_<r>.json), sleeps so that an
overlapping build would be seen unfinished, then marks itself done (OUT/done_<r>). Arguments: one
OUT,FAILING,PORT a run, run in turn in this one process (a torch start-up each costs seconds): the
rank whose build fails ("none" for none) and the run's own rendezvous port; each rank writes what
it raised to OUT/raised_<r>.txt."""

import datetime
import json
import os
import sys
import time
from pathlib import Path

import torch.distributed as dist

from gptrain.train import builders


def recorder(out: Path, failing: str, rank: int):
    def recording_build(cfg, vocab, tokenizer, asked_by=None, note=None):
        done = sorted(int(path.name.split("_")[1]) for path in out.glob("done_*"))
        (out / f"entered_{rank}.json").write_text(json.dumps(done))
        time.sleep(0.5)
        if failing == str(rank):
            raise builders.DataError(f"index cache of rank {rank} unwritable")
        (out / f"done_{rank}").touch()
        return ("train", "valid", "test")

    return recording_build


def run(out: Path, failing: str) -> None:
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    rank = dist.get_rank()
    builders._build_datasets = recorder(out, failing, rank)
    try:
        built = builders.build_datasets(None, 0, None, local_rank=rank % 2)
        (out / f"raised_{rank}.txt").write_text(f"built {built[0]}")
    except builders.DataError as error:
        (out / f"raised_{rank}.txt").write_text(str(error))
    dist.destroy_process_group()


if __name__ == "__main__":
    for spec in sys.argv[1:]:
        out, failing, port = spec.split(",")
        os.environ["MASTER_PORT"] = port
        run(Path(out), failing)
