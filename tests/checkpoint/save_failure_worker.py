"""One gloo rank for tests/checkpoint/test_save_failures_ranks.py: save step_2, then step_4 with a full
disk on one rank only, as MODE says; write the save's outcome and whether the ranks still meet in the
next collective (the first of training after a save) to OUT/rank_<r>.json. Argument: a JSON list of
[ROOT, OUT, MODE, SAVE (sync or async)] scenarios, run in turn in one process group (one start-up
for the test file), each scenario's full disk undone after it.

MODE rankfile: rank 1's rank_1.pt meets the full disk. complete: rank 0's COMPLETE does. staging: rank 1's
staging copy of an async save fails (a second into it) instead. slowcopy: nothing fails, rank 1's
staging copy takes a second longer. SAVE pinned: async, through the stager CUDA runs use
(BlockingAsyncStager, its buffer unpinned here). Each rank also records how long its training thread
stalled in the save and the optimizer step's wait for its copy, and which threads ran an all-reduce over
the background save's group."""

import contextlib
import datetime
import errno
import json
import sys
import threading
import time
import warnings
from collections.abc import Iterator
from pathlib import Path

import torch
import torch.distributed as dist
from gloo_worker import run_as_rank
from torch.distributed.checkpoint.staging import BlockingAsyncStager, DefaultStager

from gptrain.checkpoint import checksum_writer, rank_state
from gptrain.checkpoint import manager as checkpoint_manager
from gptrain.checkpoint.manager import CheckpointManager
from gptrain.checkpoint.staging_buffer import host_buffer_like
from gptrain.errors import GptrainError
from gptrain.utils import atomic


def state(value: float) -> dict:
    return {"model": {"w": torch.full((4,), value)}}


def disk_full(*args, **kwargs):
    raise OSError(errno.ENOSPC, "No space left on device")


@contextlib.contextmanager
def full_disk(mode: str, rank: int) -> Iterator[None]:
    """The disk full as `mode` says on this rank, undone after."""
    writers = [
        module for module in (atomic, rank_state, checksum_writer) if hasattr(module, "atomic_write_bytes")
    ]
    saved = [module.atomic_write_bytes for module in writers], checkpoint_manager.atomic_write_text
    stages = DefaultStager._stage, BlockingAsyncStager.stage
    fill_the_disk(mode, rank)
    try:
        yield
    finally:
        for module, write_bytes in zip(writers, saved[0], strict=True):
            module.atomic_write_bytes = write_bytes
        checkpoint_manager.atomic_write_text = saved[1]
        DefaultStager._stage, BlockingAsyncStager.stage = stages


def failing_copy(self, state_dict, **kwargs):
    time.sleep(1.0)  # the training thread is waiting for it by then
    raise RuntimeError("staging copy failed (injected)")


def slower_copy(copy):
    def slower(self, state_dict, **kwargs):
        time.sleep(1.0)
        return copy(self, state_dict, **kwargs)

    return slower


@contextlib.contextmanager
def all_reduces_over(group: dist.ProcessGroup | None, threads: list[str]) -> Iterator[None]:
    """The name of each thread that runs an all-reduce over `group` appended to `threads`, while open."""
    all_reduce = dist.all_reduce

    def recorded(*args, **kwargs):
        if kwargs.get("group") is group:
            threads.append(threading.current_thread().name)
        return all_reduce(*args, **kwargs)

    dist.all_reduce = recorded
    try:
        yield
    finally:
        dist.all_reduce = all_reduce


def fill_the_disk(mode: str, rank: int) -> None:
    if mode == "rankfile" and rank == 1:
        write_bytes = atomic.atomic_write_bytes

        def rank_file_full(path: Path, data: bytes) -> None:
            return disk_full() if path.name == "rank_1.pt" else write_bytes(path, data)

        for module in (atomic, rank_state, checksum_writer):  # wherever the rank file is written from
            if hasattr(module, "atomic_write_bytes"):
                module.atomic_write_bytes = rank_file_full
    if mode == "staging" and rank == 1:
        DefaultStager._stage = BlockingAsyncStager.stage = failing_copy
    if mode == "slowcopy" and rank == 1:
        BlockingAsyncStager.stage = slower_copy(BlockingAsyncStager.stage)
    if mode == "complete" and rank == 0:
        write_text = checkpoint_manager.atomic_write_text
        checkpoint_manager.atomic_write_text = lambda path, text: (
            disk_full() if path.name == "COMPLETE" else write_text(path, text)
        )


def main() -> int:
    warnings.filterwarnings("ignore")
    torch.set_num_threads(1)
    # a rank left waiting in a collective its peer never enters fails here, well within the test's timeout
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=10))
    for root, out, mode, how in json.loads(sys.argv[1]):
        scenario(Path(root), Path(out), mode, how)
    return 0


def scenario(root: Path, out: Path, mode: str, how: str) -> None:
    rank = dist.get_rank()
    # the stager as SAVE says wherever the test runs: async, DefaultStager's copy in a background thread
    pinned = how == "pinned"
    manager = CheckpointManager(root, keep_last=5, rank=rank, async_save=how != "sync", pinned_staging=pinned)
    if pinned:  # its buffer allocated ahead, unpinned: this torch may have no CUDA to pin with
        checkpoint_manager.allocate_pinned_staging = lambda s: host_buffer_like(s, pin_memory=False)
        manager.prepare_staging(state(0.0))
    manager.save(2, state(2.0), {"rank": rank})
    manager.wait()
    threads: list[str] = []
    with full_disk(mode, rank), all_reduces_over(manager._group, threads):
        started = time.monotonic()
        stalled = None
        try:
            manager.save(4, state(4.0), {"rank": rank})
            manager.wait_for_staging()  # the optimizer step's pre-hook
            stalled = time.monotonic() - started
            manager.wait()
            result = {"error": None}
        except GptrainError as error:
            result = {"error": f"{type(error).__name__}: {error}"}
        except BaseException as error:  # a collective left waiting: what the test tells apart
            result = {"error": f"not one line: {type(error).__name__}: {error}"}
        result["seconds"] = time.monotonic() - started
        result.update(stalled=stalled, all_reduce_threads=threads)
    try:
        ranks = torch.ones(1)
        dist.all_reduce(ranks)
        result["next_collective"] = ranks.item()
    except BaseException as error:
        result["next_collective"] = f"{type(error).__name__}"
    (out / f"rank_{rank}.json").write_text(json.dumps(result))
    dist.barrier()  # the scenario ends on every rank before the next one starts


if __name__ == "__main__":
    run_as_rank(main)
