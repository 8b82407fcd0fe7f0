"""One gloo rank for tests/checkpoint/test_checkpoint_ranks.py (one process group, one start-up):
save step_2, 4 and 6; make loading fail on one rank as MODE says; resume as a requeued job would,
meet the other rank in one all_reduce (the first collective of training) and write what was loaded
(or the error) to OUT/rank_<r>.json. Arguments: ROOT OUT [MODE].

MODE damaged (default): rank 0 damages rank 1's file of step_6 and of step_4. meta: rank 1 cannot
read step_6's .metadata (one node's I/O error). oom: rank 1 runs out of memory building the state
for step_6. list: rank 1's listing of the checkpoints lacks step_6 (a node's stale view). file: no
resume; a plain file named step_8 is in the way of the next save, which every rank tries.
`scenario` runs one mode inside a process group already started (checkpoint_ranks_worker.py runs
every mode of the test file in one launch); its patches are undone when it returns."""

import contextlib
import datetime
import json
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path

import torch
import torch.distributed as dist
from gloo_worker import run_as_rank

from gptrain.checkpoint import agreement as checkpoint_agreement
from gptrain.checkpoint import compat
from gptrain.checkpoint.manager import CheckpointManager
from gptrain.errors import GptrainError


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


@contextlib.contextmanager
def fail_on_rank_1(mode: str) -> Iterator[None]:
    """Rank 1's share of a failure no other rank sees (modes other than damaged), undone after."""
    read_metadata, steps = compat.read_metadata, checkpoint_agreement.complete_steps
    if mode == "meta":

        def flaky(path: Path):
            if Path(path).name == "step_6":
                raise OSError(5, "Input/output error")
            return read_metadata(path)

        compat.read_metadata = flaky
    if mode == "list":
        checkpoint_agreement.complete_steps = lambda root: [step for step in steps(root) if step != 6]
    try:
        yield
    finally:
        compat.read_metadata, checkpoint_agreement.complete_steps = read_metadata, steps


def state_fn(target: dict, mode: str, rank: int):
    def build(saved: set) -> dict:
        if mode == "oom" and rank == 1 and target["model"]["w"].sum() == 0:  # the first (newest) one
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB")
        return target

    return build


def resume(root: Path, out: Path, mode: str) -> None:
    manager = CheckpointManager(root, keep_last=5, rank=dist.get_rank())
    target, seen = state(0.0), []
    try:
        path, extra = manager.load_newest_good(
            state_fn(target, mode, manager.rank), lambda _: None, seen.append
        )
    except GptrainError as error:
        result = {"error": f"{type(error).__name__}: {error}", "warnings": seen}
        (out / f"rank_{manager.rank}.json").write_text(json.dumps(result))
        return
    ranks = torch.ones(1)
    dist.all_reduce(ranks)
    result = {"resumed": path.name, "w": target["model"]["w"].tolist(), "extra": extra, "warnings": seen}
    (out / f"rank_{manager.rank}.json").write_text(json.dumps({**result, "ranks": ranks.item()}))


def save_over_a_file(manager: CheckpointManager, root: Path, out: Path) -> None:
    """Rank 0 puts a file where step_8 goes; every rank saves step_8 and writes the error it got."""
    if manager.rank == 0:
        (root / "step_8").write_text("notes\n")
    dist.barrier()
    try:
        manager.save(8, state(8.0), {"step": 8, "rank": manager.rank})
        result = {"error": None}
    except GptrainError as error:
        result = {"error": f"{type(error).__name__}: {error}"}
    dist.barrier()  # every rank is still in step with the others
    (out / f"rank_{manager.rank}.json").write_text(json.dumps(result))


def scenario(root: Path, out: Path, mode: str = "damaged") -> None:
    rank = dist.get_rank()
    first_run = CheckpointManager(root, keep_last=5, rank=rank)
    for step in (2, 4, 6):
        first_run.save(step, state(float(step)), {"step": step, "rank": rank})
    if rank == 0 and mode == "damaged":
        damage(root)
    if mode == "file":
        save_over_a_file(first_run, root, out)
        return
    with fail_on_rank_1(mode) if rank == 1 else contextlib.nullcontext():
        dist.barrier()
        resume(root, out, mode)
        dist.barrier()


def main() -> int:
    warnings.filterwarnings("ignore")
    torch.set_num_threads(1)
    # a rank waiting in a collective its peer never enters fails here, well within the test's timeout
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=30))
    scenario(Path(sys.argv[1]), Path(sys.argv[2]), *sys.argv[3:4])
    return 0


if __name__ == "__main__":
    run_as_rank(main)
