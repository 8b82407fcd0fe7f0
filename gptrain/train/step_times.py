"""Per-rank step times for the straggler line of `gptrain status`.

On every logged iteration each rank appends one JSON line to
`<explicit_log_dir>/step_times/rank-<r>.jsonl`: its mean wall time per step since the last
line, and how long it waited at the step-end agreement (an all-reduce every rank joins).
The device is synchronized on logged iterations before that agreement, so the wait is how
much earlier this rank got there than the last one: the rank that waits least is the one the
others wait for. busy = step - wait is what `gptrain status` compares with the median, among
the lines of the newest step and world size (files of ranks a resumed smaller job lacks stay).
It sees slowness after the step's last collective (optimizer, host stalls, logging); a GPU
slow inside the overlapped backward is found by `gptrain validate gpus` instead. Validation and
checkpoint saves are left out of the step time (`excluded`), as the iteration line leaves them out:
every rank spends them alike, and in a line they hid a slow rank behind minutes of common time.
A process's first logged step writes no line: it holds the process's start-up (the file opens before
the start-up agreement, where the ranks that finished early wait for the last) and its compilation,
which named the rank that waited, after every restart, as the iteration line and the curves leave
that step's time out.

A file past ROTATE_BYTES is renamed `rank-<r>.jsonl.1` (replacing the one before) just before the
next line is written, so each rank keeps at most about twice that (thousands of logged steps of
history) however long the run, and its current file always holds its newest line.
"""

from __future__ import annotations

import json
import os
import socket
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from gptrain.train.results import warn_unwritable

T = TypeVar("T")
STEP_TIMES_DIR = "step_times"
ROTATE_BYTES = 256 * 1024  # about 3,000 lines of ~87 bytes


@dataclass
class StepTimes:
    path: Path | None  # None: a world of 1, nothing to compare
    rank: int
    node: str
    world: int
    last: float = field(default_factory=time.perf_counter)
    steps: int = 0
    size: int = 0  # of the file after this process's last write (0 before the first)
    rotate_bytes: int = ROTATE_BYTES
    excluded_s: float = 0.0  # validation and saves since the last line
    warm_up: bool = True  # the next logged step is the process's first: start-up, not step time

    @classmethod
    def open(cls, log_dir: Path, rank: int, world_size: int) -> StepTimes:
        node = os.environ.get("SLURMD_NODENAME") or socket.gethostname().split(".")[0]
        path = None
        if world_size > 1:
            path = log_dir / STEP_TIMES_DIR / f"rank-{rank}.jsonl"  # made at the first line (append)
        return cls(path, rank, node, world_size)

    @contextmanager
    def excluded(self) -> Iterator[None]:
        """Time spent in the block (a validation, a save) is not step time."""
        began = time.perf_counter()
        try:
            yield
        finally:
            self.excluded_s += time.perf_counter() - began

    def timed_sync(self, step: int, logged: bool, sync: Callable[[], T]) -> T:
        """Run the step-end agreement; on logged steps record this rank's times."""
        started = time.perf_counter()
        result = sync()
        now = time.perf_counter()
        self.steps += 1
        if logged and self.path is not None and not self.warm_up:
            step_ms = max(0.0, now - self.last - self.excluded_s) / self.steps * 1000
            line = {"step": step, "rank": self.rank, "world": self.world, "node": self.node}
            line["step_ms"] = round(step_ms, 3)
            line["wait_ms"] = round((now - started) * 1000, 3)
            self.append(json.dumps(line) + "\n")
        if logged:
            self.last, self.steps, self.excluded_s, self.warm_up = now, 0, 0.0, False
        return result

    def append(self, text: str) -> None:
        """Append to this rank's file, first moving it aside when it has grown past rotate_bytes.
        A write the file system refuses (a full disk) is said once and the file given up, as the
        run log's and TensorBoard's are: raised here, after the step-end agreement, it ended the run
        on this rank alone, far from its next checkpoint."""
        assert self.path is not None
        try:
            if self.size == 0:  # not at open: a run that fails in its first step leaves no empty folder
                self.path.parent.mkdir(parents=True, exist_ok=True)
            if self.size >= self.rotate_bytes:
                os.replace(self.path, self.path.with_name(self.path.name + ".1"))
            with open(self.path, "a") as handle:
                handle.write(text)
                self.size = handle.tell()
        except OSError as error:
            path, self.path = self.path, None
            warn_unwritable(
                path, error, "no more step times from this rank (gptrain status's straggler line)"
            )
