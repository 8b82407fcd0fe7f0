"""Hang detection: a per-rank watchdog thread that ends a stuck job and names the stuck rank.

Without it, a rank that stops (a dead data mount, a deadlock, a lost GPU) leaves every other rank
waiting in a collective until torch's timeout (10-30 minutes) ends them with an opaque NCCL/gloo
error that names nobody. Each rank publishes a heartbeat to the process group's key-value store
when it enters and leaves a training step. When a rank has been inside one step for
`trainer.hang_timeout_minutes` (not counting its first step, which may compile, build NCCL
communicators or read caches), its watchdog reads every rank's heartbeat: the ranks that never
entered the step are the stuck ones. It prints one line naming them (rank, host, pid, last
progress), posts that line to the store so every rank prints the same and ends the same way, and
the process exits with EXIT_HUNG (76), which the rendered batch script requeues; the requeued run
resumes from the last complete checkpoint.

Only the step is watched: checkpoint saves and validation may legitimately take long.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TextIO

from gptrain.errors import EXIT_HUNG

# Tests only: "<rank>:<iteration>" makes that rank stop, forever, before that iteration (in the
# first run of a Slurm job only, so that the requeued job runs through).
TEST_HOOK = "GPTRAIN_TEST_STOP_RANK"
HANG_KEY = "gptrain/watchdog/hang"
ACK_KEY = "gptrain/watchdog/ack"
GRACE_SECONDS = 10.0  # how long the first rank to give up waits for the others, so all exit 76


def beat_key(rank: int) -> str:
    return f"gptrain/watchdog/rank{rank}"


def default_store() -> Any | None:
    """The default process group's store (a TCPStore every rank already reaches), or None."""
    try:
        from torch.distributed import distributed_c10d

        return distributed_c10d._get_default_store()
    except Exception:  # no process group, or a torch without the helper: report this rank only
        return None


def stop_here_for_tests(rank: int, iteration: int) -> None:
    first_run = os.environ.get("SLURM_RESTART_COUNT", "0") == "0"
    if os.environ.get(TEST_HOOK) == f"{rank}:{iteration}" and first_run:
        print(
            f"gptrain: {TEST_HOOK}: rank {rank} stops before iteration {iteration}",
            file=sys.stderr,
            flush=True,
        )
        while True:
            time.sleep(3600)


class Watchdog:
    """Heartbeats from the loop (`with watchdog.step(i): ...`) and a thread that acts on silence."""

    def __init__(
        self,
        rank: int,
        world_size: int,
        timeout_s: float,
        store: Any | None = None,
        exit_fn: Callable[[int], None] = os._exit,
        out: TextIO | None = None,
    ) -> None:
        self.rank, self.world_size, self.timeout_s, self.store = rank, world_size, timeout_s, store
        self.host, self.pid = socket.gethostname(), os.getpid()
        self.exit_fn, self.out = exit_fn, out
        self.fired: str | None = None
        self._lock = threading.Lock()
        self._since: float | None = None  # monotonic time the current watched step began
        self._iteration = 0
        self._steps_done = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @classmethod
    def start(cls, timeout_minutes: float, rank: int, world_size: int) -> Watchdog:
        """A running watchdog; with timeout 0 only the (test) hook of `step` remains."""
        dog = cls(rank, world_size, timeout_minutes * 60, default_store() if world_size > 1 else None)
        if timeout_minutes > 0:
            dog._thread = threading.Thread(target=dog.watch, name="gptrain-watchdog", daemon=True)
            dog._thread.start()
        return dog

    @property
    def enabled(self) -> bool:
        return self.timeout_s > 0

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    @contextmanager
    def step(self, iteration: int) -> Iterator[None]:
        """Watch one training step (1-based iteration, as in the log lines)."""
        stop_here_for_tests(self.rank, iteration)
        self._mark(iteration, "in")
        yield
        self._mark(iteration, "done")

    def _mark(self, iteration: int, phase: str) -> None:
        if not self.enabled:
            return
        with self._lock:
            self._iteration = iteration
            if phase == "in":
                self._since = time.monotonic() if self._steps_done > 0 else None  # first step: not timed
            else:
                self._since = None
                self._steps_done += 1
        if self.store is not None:
            beat = {
                "host": self.host,
                "pid": self.pid,
                "iteration": iteration,
                "phase": phase,
                "time": time.time(),
            }
            self.store.set(beat_key(self.rank), json.dumps(beat))

    def watch(self) -> None:
        """The thread: end the job when a peer reported a hang or this rank's step is overdue."""
        poll = min(1.0, max(0.05, self.timeout_s / 5))
        while not self._stop.wait(poll):
            message = self.peer_report() or self.overdue()
            if message is not None:
                self.end(message)
                return

    def peer_report(self) -> str | None:
        if self.store is None:
            return None
        try:
            return self.store.get(HANG_KEY).decode() if self.store.check([HANG_KEY]) else None
        except Exception:  # store gone (rank 0 ended): this rank's own timeout still applies
            return None

    def overdue(self) -> str | None:
        with self._lock:
            since, iteration = self._since, self._iteration
        if since is None or time.monotonic() - since <= self.timeout_s:
            return None
        return self.diagnose(iteration)

    def read_beats(self) -> dict[int, dict[str, Any]]:
        beats = {}
        for rank in range(self.world_size):
            try:
                if self.store is not None and self.store.check([beat_key(rank)]):
                    beats[rank] = json.loads(self.store.get(beat_key(rank)))
            except Exception:
                continue
        return beats

    def diagnose(self, iteration: int) -> str:
        """One line: which ranks never entered `iteration` while the others wait inside it."""
        waited = f"{self.timeout_s:.0f} s (trainer.hang_timeout_minutes)"
        if self.store is None:
            return f"hang: rank {self.rank} on host {self.host} (pid {self.pid}) made no progress in iteration {iteration} for {waited}"
        beats = self.read_beats()
        waiting = [r for r, b in beats.items() if b["iteration"] == iteration and b["phase"] == "in"]
        stuck = [r for r in range(self.world_size) if r not in waiting]
        if not stuck:
            return (
                f"hang: all {self.world_size} ranks are inside iteration {iteration} with no progress for"
                f" {waited}: a collective or a kernel is stuck (noticed by rank {self.rank} on host {self.host})"
            )
        named = "; ".join(describe(r, beats.get(r)) for r in stuck)
        return (
            f"hang: stuck {named}: it never started iteration {iteration}, which rank(s)"
            f" {', '.join(map(str, waiting))} waited in for {waited}"
        )

    def end(self, message: str) -> None:
        """Agree on one message through the store, print it, let the other ranks see it, exit 76."""
        if self.store is not None:
            try:
                message = self.store.compare_set(HANG_KEY, "", message).decode()
                self.store.add(ACK_KEY, 1)
                deadline = time.monotonic() + GRACE_SECONDS
                while self.store.add(ACK_KEY, 0) < self.world_size and time.monotonic() < deadline:
                    time.sleep(0.1)
            except Exception:  # the store went away with another rank: exit all the same
                pass
        self.fired = message
        line = f"gptrain: rank {self.rank}: {message}; exit {EXIT_HUNG} (a requeued job resumes from the last checkpoint)"
        print(line, file=self.out or sys.stderr, flush=True)
        self.exit_fn(EXIT_HUNG)


def describe(rank: int, beat: dict[str, Any] | None) -> str:
    if beat is None:
        return f"rank {rank} (no heartbeat)"
    where = "finishing" if beat["phase"] == "done" else "inside"
    age = time.time() - float(beat["time"])
    return (
        f"rank {rank} on host {beat['host']} (pid {beat['pid']}), last seen {where} iteration"
        f" {beat['iteration']} ({age:.0f} s ago)"
    )
