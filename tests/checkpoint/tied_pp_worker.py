"""One gloo rank for tests/checkpoint/test_tied_pipeline_load.py: a tied model split over two
pipeline stages, as gptrain lays it out (rank 0, the first stage, holds model.tok_embeddings.weight;
rank 1, the last, model.output.weight, its synchronised copy). Saves a checkpoint with both
tensors as KIND says (tied: equal, untied: different), loads it into that tied layout with
TIED_READER (1: the reader told the model is tied, 0: not) and writes the result or the error to
OUT/rank_<r>.json. Argument: a JSON list of [ROOT, OUT, KIND, TIED_READER, SAVED_ROWS] scenarios,
run in turn in one process group (one start-up for the test file)."""

import datetime
import json
import sys
import warnings
from pathlib import Path

import torch
import torch.distributed as dist
from gloo_worker import run_as_rank

from gptrain.checkpoint.manager import CheckpointManager
from gptrain.errors import GptrainError

HIDDEN = 3


def table(rows: int, offset: float) -> torch.Tensor:
    return torch.arange(rows * HIDDEN, dtype=torch.float32).reshape(rows, HIDDEN) + offset


def stage_state(rank: int, embedding: torch.Tensor, output: torch.Tensor) -> dict:
    name = "tok_embeddings.weight" if rank == 0 else "output.weight"
    return {"model": {name: embedding if rank == 0 else output}}


def main() -> int:
    warnings.filterwarnings("ignore")
    torch.set_num_threads(1)
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=30))
    for root, out, kind, tied, saved_rows in json.loads(sys.argv[1]):
        scenario(Path(root), Path(out), kind, bool(tied), saved_rows)
    return 0


def scenario(root: Path, out: Path, kind: str, tied: bool, saved_rows: int) -> None:
    rank = dist.get_rank()
    embedding = table(saved_rows, 0.0)
    output = embedding.clone() if kind == "tied" else table(saved_rows, 0.5)
    CheckpointManager(root, keep_last=None, rank=rank).save(2, stage_state(rank, embedding, output), {})
    live = stage_state(rank, torch.zeros(8, HIDDEN), torch.zeros(8, HIDDEN))
    reader = CheckpointManager(root, keep_last=None, rank=rank, vocab_size=6, tied=tied)
    try:
        reader.load_verified(root / "step_2", lambda saved: live, lambda _: None)
        (weight,) = live["model"].values()
        result = {"loaded": weight.tolist()}
    except GptrainError as error:
        result = {"error": f"{type(error).__name__}: {error}"}
    (out / f"rank_{rank}.json").write_text(json.dumps(result))
    dist.barrier()


if __name__ == "__main__":
    run_as_rank(main)
