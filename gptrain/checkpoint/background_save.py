"""What a background save runs beside the training: its own process group, the thread that marks it
once written, and its futures' outcome taken without raising it (gptrain.checkpoint.manager)."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future

import torch.distributed as dist

from gptrain.checkpoint.checksum_writer import MARKING, Note, noted
from gptrain.checkpoint.save_report import SaveReport
from gptrain.utils.group_timeout import default_group_timeout


def background_save_group() -> dist.ProcessGroup:
    """The gloo group background saves talk over: a collective from the writer thread must never
    interleave with the training's collectives on the default group.

    Created with lazy connections (TORCH_GLOO_LAZY_INIT, read by torch when a gloo group is made):
    eager, every process holds a socket to every other, world + 3 descriptors each (EMFILE past
    ~1,000 ranks under nofile=1024). DCP's collectives on it gather to and scatter from the
    coordinator (rank 0) and all-gather sizes in a ring, so rank 0 still connects to every rank
    and each other rank to a handful (measured: 3-5 at 8 ranks; docs/reliability.md). Its collectives
    wait as long as the default group's (gloo's own default is 30 minutes)."""
    before = os.environ.get("TORCH_GLOO_LAZY_INIT")
    os.environ["TORCH_GLOO_LAZY_INIT"] = "1"
    try:
        return dist.new_group(backend="gloo", timeout=default_group_timeout())
    finally:
        if before is None:
            del os.environ["TORCH_GLOO_LAZY_INIT"]
        else:
            os.environ["TORCH_GLOO_LAZY_INIT"] = before


def first_failure(futures: tuple[Future | None, ...], deadline: float) -> BaseException | None:
    """The first error of `futures` (waited for up to `deadline`; TimeoutError past it), taken without
    raising it: raised on a run's way out by an error, it would take that error as its context, which
    root_cause follows, and the save's line would name the run's error instead of its own."""
    for future in futures:
        if future is not None:
            error = future.exception(timeout=max(0.0, deadline - time.monotonic()))
            if error is not None:
                return error
    return None


def marked_when_written(
    upload: Future,
    mark: Callable[[], None] | None,
    report: SaveReport,
    started: float,
    note: Note | None = None,
) -> Future:
    """Done once the write has ended (its time in `report`) and `mark` (rank 0's: manifest, COMPLETE,
    latest, pruning) has run, in a thread of its own: the manifest reads every rank's checksum sidecar
    and stats the files they name (about 3 files per rank), which must not stall training when a later
    step polls, and a crash between the write and that poll no longer loses a finished checkpoint.
    `note` (the save's OwnWork) is told of the marking: rank 0's own work, which a training thread
    waiting for the save (the next one's wait for it) waits on while the others wait in the agreement."""
    marked: Future = Future()

    def mark_when_written() -> None:
        try:
            upload.result()
            if mark is not None:
                with noted(note, MARKING):
                    mark()
            report.write_s = time.perf_counter() - started
        except BaseException as error:  # DCP's CheckpointException is one; the training thread raises it
            marked.set_exception(error)
        else:
            marked.set_result(None)

    threading.Thread(target=mark_when_written, name="gptrain-mark-complete", daemon=True).start()
    return marked
