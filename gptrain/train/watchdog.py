"""Hang detection: a per-rank watchdog thread that ends a stuck job and names the stuck rank.

Without it, a rank that stops (a dead data mount, a deadlock, a lost GPU) leaves every other rank
waiting in a collective until torch's timeout (10-30 minutes) ends them with an opaque NCCL/gloo
error that names nobody. The training loop only notes, in memory, which step it is in; the
watchdog thread publishes that heartbeat to the process group's key-value store (one TCPStore
server on rank 0 for the whole job) every `sync_s` (the timeout / 20, at most 5 s: beats a few
seconds old are fresh for a timeout of minutes), the ranks spread over that interval, so the
training thread never waits on the store and rank 0's server sees ~0.4 calls a second per rank.
When a rank has been inside one step, or its end (the log line and the stop agreement's
exchange), for `trainer.hang_timeout_minutes` (FIRST_STEP_FACTOR times that for its first step,
which may compile, build NCCL communicators or read caches: a bad node at start or after a
requeue is caught too), the first such rank (the store's counter decides) reads every rank's
heartbeat in one `multi_get`: a rank whose beat has not been written for half that wait is gone
(SIGKILL, a lost node: NCCL waits for it until the process group's timeout); otherwise the ranks
that never entered the step are the stuck ones, or, when the others finished it, those still
inside. It posts one line naming them (rank, host, pid, last progress) to the store; the other
ranks read it (those that timed out too wait for it, the others see it at their next sync), every
rank prints it, and once all have acknowledged (or GRACE_SECONDS after the line was posted) each
exits with EXIT_HUNG (76), which the rendered batch script requeues; the requeued run resumes
from the last complete checkpoint.

Watched: each step, its end, start-up's end, and each global batch of a validation or test split
(as long as a step's forward: a rank hung there, on a data mount or a GPU, held the others in the
evaluation's collective until the process group's timeout, whose NCCL abort is not requeued), each
with the step's timeout; and each checkpoint save (`saving`: a synchronous save's write and its
collectives, a background save's agreements) with its own allowance (`save_allowance_s`). Inside a
section a rank notes what it is busy with (`doing`: loading its micro-batches, writing its files):
where every rank is inside the same section, those still busy are the stuck ones.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import Any, TextIO

from gptrain.errors import EXIT_HUNG
from gptrain.train.store_link import StoreLink

# Tests only: "<rank>:<iteration>" makes that rank stop, forever, before that iteration (in the
# first run of a Slurm job only, so that the requeued job runs through).
TEST_HOOK = "GPTRAIN_TEST_STOP_RANK"
HANG_KEY = "gptrain/watchdog/hang"
DIAGNOSER_KEY = "gptrain/watchdog/diagnoser"  # a counter: the rank that takes 1 writes the line
ACK_KEY = "gptrain/watchdog/ack"
ALL_ACKED_KEY = "gptrain/watchdog/all-acked"
SYNC_MAX_SECONDS = 5.0  # the most a heartbeat lags and a rank takes to see a posted hang
# How long the ranks wait for the others to acknowledge the posted line before exiting 76 anyway;
# it counts from the posting, so the time the diagnosis took does not eat into it.
GRACE_SECONDS = 30.0
FIRST_STEP_FACTOR = 5  # a process's first step (compile, communicators, caches) gets 5 timeouts
DIAGNOSIS_WAIT_SECONDS = 60.0  # how long a rank that timed out waits for the diagnosing rank's line


def collective_timeout_minutes(hang_timeout_minutes: float) -> float:
    """The process group's timeout: longer than the watchdog's longest wait (a first step's
    FIRST_STEP_FACTOR timeouts, then its diagnosis and grace), so that the watchdog, not NCCL's
    abort (SIGABRT, no line, exit 134, not requeued), ends a hang."""
    return max(30.0, (FIRST_STEP_FACTOR + 1) * hang_timeout_minutes + 5.0)


def beat_key(rank: int) -> str:
    return f"gptrain/watchdog/rank{rank}"


def default_store() -> Any | None:
    """The default process group's store (a TCPStore every rank already reaches), or None."""
    try:
        from torch.distributed import distributed_c10d

        return distributed_c10d._get_default_store()
    except Exception:  # no process group, or a torch without the helper: report this rank only
        return None


STORE_GONE = "rank 0 (the job's store, which its process serves, cannot be reached)"


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
    """Progress noted by the loop (`with watchdog.step(i): ...`); a thread publishes it and acts on silence."""

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
        self.note: Callable[[str], None] | None = None  # the run's log file (RunLog.to_file), set by the loop
        self.requeue = True  # False where the run saves no checkpoint: a requeue would start it over
        self.poll_s = min(1.0, max(0.05, timeout_s / 5))  # local checks, no store call
        self.sync_s = max(self.poll_s, min(SYNC_MAX_SECONDS, timeout_s / 20))  # store calls
        self.fired: str | None = None
        self._lock = threading.Lock()
        self._since: float | None = None  # monotonic time the current watched step began
        self._budget = timeout_s  # seconds it may take (FIRST_STEP_FACTOR times that for the first)
        self._allowed = "trainer.hang_timeout_minutes"  # what gave it, for the hang's line
        self._first: int | None = None  # this process's first iteration (a resumed run's is not 1)
        self._iteration = 0
        self._steps_done = 0
        # watched sections entered: every rank runs the same ones in the same order (each holds a
        # collective or waits on one), so a rank that entered fewer is behind, one that entered more past
        self._sections = 0
        # (iteration, split) of this process's first evaluation: all of it (its batches may compile,
        # its closing reduction waits for the slowest rank's compile) gets FIRST_STEP_FACTOR
        self._first_evaluation: tuple[int, str] | None = None
        self._beat: dict[str, Any] | None = None  # this rank's progress, as the store should show it
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        # looked at before each store call: one on a connection rank 0's end closed prints C++'s stack
        self.link = StoreLink.find(store) if store is not None else StoreLink()

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
        self.link.close()

    @contextmanager
    def step(self, iteration: int) -> Iterator[None]:
        """Watch one training step (1-based iteration, as in the log lines)."""
        stop_here_for_tests(self.rank, iteration)
        self._mark(iteration, "in")
        yield
        self._mark(iteration, "done")

    @contextmanager
    def boundary(self, iteration: int, phase: str = "end") -> Iterator[None]:
        """Watch the work at the end of a step that every rank must get through before the next one
        (its log line, the stop agreement's exchange): a rank blocked on a hung file system there
        holds every other rank in the exchange, outside any step. Its own phase: a rank here is past
        step `iteration`, so one still inside that step is the stuck one. "start": start-up's end,
        before the first step (`iteration`), where the ranks agree whether to train."""
        self._mark(iteration, phase)
        yield
        self._mark(iteration, "done")

    @contextmanager
    def saving(self, iteration: int, budget_s: float) -> Iterator[None]:
        """Watch a checkpoint save after step `iteration` (every rank saves at the same points), given
        `budget_s` (save_allowance_s). Left done however it ends: a failed save's error is the run's."""
        self._mark(iteration, "save", budget_s=budget_s)
        try:
            yield
        finally:
            self._mark(iteration, "done")

    @contextmanager
    def doing(self, what: str) -> Iterator[None]:
        """Note, inside a watched section, that this rank is busy with `what` ("loading its micro-batches"):
        a rank still busy where the others are done with it and wait in the section's collective is
        the stuck one (memory only, as `_mark`)."""
        self.busy(what)
        yield  # an error leaves it noted until the next section: the rank is past it then
        self.busy(None)

    def busy(self, what: str | None) -> None:
        """`doing`, noted until the next call (None: done with it) or section."""
        if not self.enabled:
            return
        with self._lock:
            if self._beat is not None and self._beat["phase"] != "done":
                self._beat = {**self._beat, "doing": what}

    @contextmanager
    def evaluation(self, iteration: int, split: str, batch: int | None) -> Iterator[None]:
        """Watch one global batch (1-based) of the `split` ("validation", "test split") evaluated after
        step `iteration`, or with batch None its closing reduction. Left done however it ends: a stop
        gives the evaluation up from inside a batch (EvaluationStopped), and the save that follows is
        not watched."""
        self._mark(iteration, "eval", split=split, batch=batch)
        try:
            yield
        finally:
            self._mark(iteration, "done")

    def _mark(self, iteration: int, phase: str, budget_s: float | None = None, **where: object) -> None:
        """On the training thread, every step: memory only, never a store call. `budget_s`: a save's."""
        if not self.enabled:
            return
        with self._lock:
            entered = phase != "done"
            self._sections += entered
            last = self._beat or {}
            # a beat of a section left says which (an evaluation's, its split and batch)
            left = (
                {}
                if entered
                else {"of": last.get("phase"), "split": last.get("split"), "batch": last.get("batch")}
            )
            beat = {
                "host": self.host,
                "pid": self.pid,
                "iteration": iteration,
                "phase": phase,
                "section": self._sections,
                "time": time.time(),
                **where,
                **left,
            }
            self._iteration = iteration
            if budget_s is not None:  # a save's own allowance
                self._since, self._budget, self._allowed = time.monotonic(), budget_s, "the save's allowance"
            elif entered and phase == "eval":
                self._since = time.monotonic()
                evaluation = (iteration, where.get("split"))
                self._first_evaluation = self._first_evaluation or evaluation
                self._allow(evaluation == self._first_evaluation, "evaluation")
            elif entered:
                self._since = time.monotonic()
                if self._first is None:
                    self._first = iteration
                # the first iteration's end too: its stop agreement waits for the slowest rank's
                # first step (a node with a cold compile cache beside warm ones, after a requeue)
                self._allow(iteration == self._first, "iteration")
            else:
                self._since = None
                self._steps_done += 1
            self._beat = beat

    def _allow(self, first: bool, what: str) -> None:
        """The step's time, FIRST_STEP_FACTOR times it for a process's first `what`, and why, for the line."""
        self._budget = self.timeout_s * (FIRST_STEP_FACTOR if first else 1)
        why = f"{FIRST_STEP_FACTOR} x trainer.hang_timeout_minutes, as a process's first {what}"
        self._allowed = why if first else "trainer.hang_timeout_minutes"

    def publish(self) -> None:
        """Write this rank's heartbeat to the store, with the time it was written ("seen"): at every
        sync, changed or not, so that a rank whose process died (SIGKILL, a lost node) falls silent,
        which a live rank waiting in a collective never does (its progress does not change either)."""
        with self._lock:
            beat = self._beat
        if self.store is None or beat is None or self.link.closed():
            return
        with contextlib.suppress(Exception):  # store gone (rank 0 ended): this rank's own timeout applies
            self.store.set(beat_key(self.rank), json.dumps({**beat, "seen": time.time()}))

    def watch(self) -> None:
        """The thread: publish progress, end the job when a peer reported a hang or a step is overdue."""
        # ranks start together: spread their store calls over one interval rather than one millisecond
        next_sync = time.monotonic() + self.sync_s * self.rank / max(1, self.world_size)
        while not self._stop.wait(max(0.0, min(self.poll_s, next_sync - time.monotonic()))):
            message = None
            if time.monotonic() >= next_sync:
                next_sync = max(next_sync + self.sync_s, time.monotonic())
                self.publish()
                message = self.peer_report()
            message = message or self.overdue()
            if message is not None:
                self.end(message)
                return

    def peer_report(self) -> str | None:
        if self.store is None or self.link.closed():
            return None
        try:
            return self.store.get(HANG_KEY).decode() if self.store.check([HANG_KEY]) else None
        except Exception:  # store gone (rank 0 ended): this rank's own timeout still applies
            return None

    def overdue(self) -> str | None:
        with self._lock:
            since, iteration, budget = self._since, self._iteration, self._budget
        if since is None or time.monotonic() - since <= budget:
            return None
        return self.hang_message(iteration)

    def hang_message(self, iteration: int) -> str:
        """The job's one line about the hang: diagnosed here by the first rank to time out, read by the rest.

        On a hang every rank times out within the same second; one diagnosis (two store calls) instead
        of one per rank keeps rank 0's store server from serving world x world reads.
        """
        if self.store is None or self.link.closed():
            return self.diagnose(iteration)
        self.publish()  # this rank's own heartbeat, current before anyone reads it
        try:
            if self.store.add(DIAGNOSER_KEY, 1) > 1:
                self.store.wait([HANG_KEY], timedelta(seconds=DIAGNOSIS_WAIT_SECONDS))
                return self.store.get(HANG_KEY).decode()
        except Exception:  # the store or the diagnosing rank went away: diagnose here
            pass
        return self.diagnose(iteration)

    def read_beats(self) -> dict[int, dict[str, Any]] | None:
        """Every rank's heartbeat: two store calls when all ranks have one; None: the store is gone."""
        if self.store is None:
            return {}
        if self.link.closed():
            return None
        keys = [beat_key(rank) for rank in range(self.world_size)]
        try:
            ranks = list(range(self.world_size))
            if not self.store.check(keys):  # a rank stopped before its first beat: look key by key, once
                ranks = [rank for rank in ranks if self.store.check([keys[rank]])]
            values = self.store.multi_get([keys[rank] for rank in ranks]) if ranks else []
            return {rank: json.loads(value) for rank, value in zip(ranks, values, strict=True)}
        except Exception:
            return None

    def silent(self, beats: dict[int, dict[str, Any]]) -> list[int]:
        """Ranks not heard from for half the time this rank waited (and 3 syncs, 2 s at least): a live
        rank writes its beat every sync, so these are dead, lost with their node, or frozen."""
        after = max(self._budget / 2, 3 * self.sync_s, 2.0)
        now = time.time()
        return [r for r, b in beats.items() if r != self.rank and now - float(b.get("seen", now)) > after]

    def gone_peers(self, timeout_s: float = 10.0) -> str | None:
        """The ranks known to be gone, for a collective that lost a peer: rank 0 when its store cannot
        be read, else those on this host whose pid is no longer there (another host's cannot be asked).
        The store is read from a thread given `timeout_s`: a lost node's connection may never reset."""
        if self.link.closed(wait_s=1.0):  # rank 0's end of it may close a moment after the collective's
            return STORE_GONE
        read: list[dict[int, dict[str, Any]] | None] = []
        reader = threading.Thread(target=lambda: read.append(self.read_beats()), daemon=True)
        reader.start()
        reader.join(timeout_s)
        if not read:
            return None
        beats = read[0]
        if beats is None:
            return STORE_GONE
        here = {r: b for r, b in sorted(beats.items()) if r != self.rank and b["host"] == self.host}
        for _ in range(30):  # a killed process closes its sockets before it is gone: give it 3 s
            if gone := [describe(r, b) for r, b in here.items() if not _alive(int(b["pid"]))]:
                return "; ".join(gone)
            if not here:
                break
            time.sleep(0.1)
        return None

    def diagnose(self, iteration: int) -> str:
        """One line: which ranks never entered this rank's watched section (in `iteration`) while the
        others wait inside it, or which are still inside it when others are past it."""
        with self._lock:
            mine = self._beat or {"iteration": iteration, "phase": "in", "section": self._sections}
            waited = f"{self._budget:.0f} s ({self._allowed})"  # the time it was given, and by what
        place = _place(mine)
        if self.store is None:
            return f"hang: rank {self.rank} on host {self.host} (pid {self.pid}) made no progress in {place} for {waited}"
        beats = self.read_beats()
        if beats is None:  # the store's server is rank 0's: it ended, its node with it perhaps
            return (
                f"hang: rank {self.rank} on host {self.host} made no progress in {place} for"
                f" {waited} and cannot reach the job's store, which rank 0 serves: rank 0 is most likely gone"
                " (its process died or its node was lost)"
            )
        if silent := self.silent(beats):
            named = "; ".join(describe(r, beats[r]) for r in silent)
            return (
                f"hang: {named}: not heard from since (its process died, its node was lost, or it is frozen),"
                f" while rank {self.rank} waited in {place} for {waited}"
            )
        here = _position(mine)
        waiting = [r for r, b in beats.items() if _position(b) == here]
        past = [r for r, b in beats.items() if _position(b) > here]
        stuck = [r for r in range(self.world_size) if r not in waiting and r not in past]
        busy = [r for r in waiting if beats[r].get("doing")]
        if not stuck and not past and 0 < len(busy) < len(waiting):  # the others wait for them inside it
            named = "; ".join(describe(r, beats[r]) for r in busy)
            idle = ", ".join(str(r) for r in waiting if r not in busy)
            return f"hang: stuck {named}: still at it after {waited}, which rank(s) {idle} finished, waiting in {place}"
        if not stuck and past:  # the others finished it and went on: those still inside are stuck
            named = "; ".join(describe(r, beats.get(r)) for r in waiting)
            return (
                f"hang: stuck {named}: inside {place} for {waited}, which rank(s)"
                f" {', '.join(map(str, past))} finished"
            )
        if not stuck:
            return (
                f"hang: all {self.world_size} ranks are inside {place} with no progress for"
                f" {waited}: a collective or a kernel is stuck (noticed by rank {self.rank} on host {self.host})"
            )
        named = "; ".join(describe(r, beats.get(r)) for r in stuck)
        return (
            f"hang: stuck {named}: it never started {place}, which rank(s)"
            f" {', '.join(map(str, waiting))} waited in for {waited}"
        )

    def end(self, message: str) -> None:
        """Agree on one message through the store, print it, wait for the other ranks, exit 76."""
        if self.store is not None:
            try:
                message = self.store.compare_set(HANG_KEY, "", message).decode()
                self.wait_for_every_rank()
            except Exception:  # the store went away with another rank, or a rank never came: exit anyway
                pass
        self.fired = message
        code, then = (
            (EXIT_HUNG, "a requeued job resumes from the last checkpoint")
            if self.requeue
            else (1, "checkpoints are off, so the job is not requeued to start over")
        )
        line = f"gptrain: rank {self.rank}: {message}; exit {code} ({then})"
        print(line, file=self.out or sys.stderr, flush=True)
        self.write_note(line)
        self.exit_fn(code)

    def write_note(self, line: str, timeout_s: float = 2.0) -> None:
        """The line into the run's log too (read across requeues), from a thread given `timeout_s`:
        the hang may be a hung mount, and the exit must not wait on it."""
        if self.note is None:
            return
        writer = threading.Thread(target=self.note, args=(line,), name="gptrain-hang-note", daemon=True)
        writer.start()
        writer.join(timeout_s)

    def wait_for_every_rank(self) -> None:
        """Acknowledge the line; the last rank to do so releases all (a server-side wait, no polling)."""
        assert self.store is not None
        if self.store.add(ACK_KEY, 1) >= self.world_size:
            self.store.set(ALL_ACKED_KEY, "1")
        else:
            self.store.wait([ALL_ACKED_KEY], timedelta(seconds=GRACE_SECONDS))


def _alive(pid: int) -> bool:
    """Whether process `pid` of this host runs: not gone, nor a zombie its launcher has yet to reap."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # another user's process: there
        pass
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            return stat.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except (OSError, IndexError):  # no /proc (macOS)
        return True


def _position(beat: dict[str, Any]) -> tuple[int, bool]:
    """How far a rank got: the watched sections it entered, and whether it left the last."""
    return int(beat.get("section", 0)), beat["phase"] == "done"


def _place(beat: dict[str, Any]) -> str:
    """The watched section a beat is in (or, done, the one it left: a step's end is its step's), in words."""
    iteration, phase = beat["iteration"], beat["phase"]
    if phase == "done":
        phase = "in" if beat.get("of") in (None, "end", "done") else beat["of"]
    if phase == "start":
        return f"the end of start-up, before iteration {iteration}"
    if phase == "save":
        return f"the checkpoint save of iteration {iteration}"
    if phase == "eval":
        split = beat.get("split") or "evaluation"
        if beat.get("batch") is None:
            return f"the end of the {split} after iteration {iteration}"
        return f"global batch {beat['batch']} of the {split} after iteration {iteration}"
    return f"the end of iteration {iteration}" if phase == "end" else f"iteration {iteration}"


def describe(rank: int, beat: dict[str, Any] | None) -> str:
    if beat is None:
        return f"rank {rank} (no heartbeat)"
    where = "finishing" if beat["phase"] == "done" else "inside"
    age = time.time() - float(beat["time"])
    doing = f", {beat['doing']}" if beat.get("doing") else ""
    return f"rank {rank} on host {beat['host']} (pid {beat['pid']}), last seen {where} {_place(beat)}{doing} ({age:.0f} s ago)"
