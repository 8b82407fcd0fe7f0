"""One gloo rank for tests/checkpoint/test_checkpoint_ranks.py: which checkpoint a run started from
another run's (exp_manager.resume_from_checkpoint) loads, when rank 1's listings lag (a node's
stale view after a requeue). MODE own: rank 1 sees none of the run's own checkpoints. source: rank
1 does not see the source run's newest. requeued: only rank 0 found the requeued job's own
checkpoint, so only its exp_manager.resume_if_exists became true. unreadable: rank 0 cannot list
the run's checkpoints. Writes the answer to OUT/rank_<r>.txt. Arguments: RUN
SOURCE OUT MODE. `scenario` runs one mode inside a process group already started
(checkpoint_ranks_worker.py); its patches are undone when it returns."""

import datetime
import sys
import warnings
from pathlib import Path

import torch.distributed as dist
from gloo_worker import run_as_rank

from gptrain.checkpoint import directory
from gptrain.config import load_training_config
from gptrain.errors import GptrainError
from gptrain.train import resuming


def scenario(run: Path, source: Path, out: Path, mode: str) -> None:
    patched = resuming.complete_steps, directory.complete_steps
    try:
        answer(run, source, out, mode)
    finally:
        resuming.complete_steps, directory.complete_steps = patched


def answer(run: Path, source: Path, out: Path, mode: str) -> None:
    if dist.get_rank() == 1 and mode == "own":
        resuming.complete_steps = lambda root: []
    if dist.get_rank() == 0 and mode == "unreadable":

        def unreadable(root):
            raise PermissionError(13, "Permission denied", str(root))

        resuming.complete_steps = unreadable
    if dist.get_rank() == 1 and mode == "source":
        steps = directory.complete_steps
        directory.complete_steps = lambda root: steps(root)[:-1]
    overrides = [
        f"exp_manager.explicit_log_dir={run}",
        f"exp_manager.resume_from_checkpoint={source}",
        f"exp_manager.resume_if_exists={str(mode != 'requeued' or dist.get_rank() == 0).lower()}",
    ]
    try:
        start = resuming.checkpoint_to_start_from(load_training_config("gpt3/126m", overrides))
    except GptrainError as error:
        start = f"error: {error}"
    (out / f"rank_{dist.get_rank()}.txt").write_text(str(start))
    dist.barrier()


def main() -> int:
    warnings.filterwarnings("ignore")
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=30))
    scenario(Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3]), sys.argv[4])
    return 0


if __name__ == "__main__":
    run_as_rank(main)
