"""Issue 14, case 8: a rank that stops ends the job within the hang timeout, naming it, with exit 76.

Before, the other rank waited in the gradient all-reduce until torch's collective timeout
(30 minutes here) and died with an opaque gloo error naming nobody.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import socket
import sys
import threading
import time
from collections import Counter
from datetime import timedelta
from pathlib import Path

import pytest
from reliability_helpers import finish_ranks, start_ranks

from gptrain.errors import EXIT_HUNG
from gptrain.train import watchdog
from gptrain.train.watchdog import ACK_KEY, TEST_HOOK, Watchdog

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")


class FakeStore:
    """The TCPStore calls the watchdog uses, in memory; `calls` counts them by thread name."""

    def __init__(self) -> None:
        self.data: dict[str, bytes] = {}
        self.changed = threading.Condition()
        self.calls: Counter[str] = Counter()
        self.beat_reads = 0  # calls that read heartbeats
        self.beat_read_s = 0.0  # what each such call costs rank 0's (one-threaded) server

    def _count(self, keys: list[str] = ()) -> None:
        self.calls[threading.current_thread().name] += 1
        if any(k.startswith("gptrain/watchdog/rank") for k in keys):
            with self.changed:
                self.beat_reads += 1
                time.sleep(self.beat_read_s)

    def set(self, key: str, value: str) -> None:
        self._count()
        with self.changed:
            self.data[key] = value.encode()
            self.changed.notify_all()

    def get(self, key: str) -> bytes:
        self._count([key])
        with self.changed:
            return self.data[key]

    def multi_get(self, keys: list[str]) -> list[bytes]:
        self._count(keys)
        with self.changed:
            return [self.data[k] for k in keys]

    def check(self, keys: list[str]) -> bool:
        self._count(keys)
        with self.changed:
            return all(k in self.data for k in keys)

    def wait(self, keys: list[str], timeout: timedelta) -> None:
        self._count()
        with self.changed:
            if not self.changed.wait_for(lambda: all(k in self.data for k in keys), timeout.total_seconds()):
                raise TimeoutError(f"wait timeout, keys: {keys}")

    def add(self, key: str, amount: int) -> int:
        self._count()
        with self.changed:
            value = int(self.data.get(key, b"0")) + amount
            self.data[key] = str(value).encode()
            self.changed.notify_all()
            return value

    def compare_set(self, key: str, expected: str, desired: str) -> bytes:
        self._count()
        with self.changed:
            if self.data.get(key, b"") == expected.encode():
                self.data[key] = desired.encode()
                self.changed.notify_all()
            return self.data[key]


def dogs(world: int, timeout_s: float) -> tuple[list[Watchdog], list[int], FakeStore]:
    store, exits = FakeStore(), []
    made = [
        Watchdog(r, world, timeout_s, store, exit_fn=exits.append, out=io.StringIO()) for r in range(world)
    ]
    return made, exits, store


def watch(dog: Watchdog) -> threading.Thread:
    thread = threading.Thread(target=dog.watch, name=f"watchdog-{dog.rank}", daemon=True)
    thread.start()
    return thread


def test_the_rank_that_never_entered_the_step_is_named_and_every_rank_exits_76():
    (zero, one), exits, _ = dogs(2, 0.3)
    for dog in (zero, one):
        with dog.step(1):  # the first step is not timed
            pass
    threads = [watch(zero), watch(one)]
    with zero.step(2):  # rank 0 waits in the step's collective; rank 1 never comes
        for thread in threads:
            thread.join(timeout=15)
    assert exits == [EXIT_HUNG, EXIT_HUNG]
    assert zero.fired == one.fired  # one message, printed by every rank
    host = socket.gethostname()
    assert f"stuck rank 1 on host {host} (pid {os.getpid()}), last seen finishing iteration 1" in zero.fired
    assert "never started iteration 2, which rank(s) 0 waited in" in zero.fired


def through_step_1(*watchdogs) -> None:
    """Each rank runs step 1 and its end, as the loop does."""
    for dog in watchdogs:
        with dog.step(1):
            pass
        with dog.boundary(1):
            pass


def in_three_places(dogs_: list[Watchdog], gap_s: float = 0.0) -> contextlib.ExitStack:
    """Rank 2 stuck inside step 2 (a GPU fault in the optimizer step, after the step's collectives);
    rank 1 waits in step 2's end (the stop agreement's exchange), as the loop does; rank 0 went on
    past it (an unlogged step's flag is read a step late) and waits in step 3's first collective.
    Entered on the returned stack, rank 2 `gap_s` before the others."""
    through_step_1(*dogs_)
    zero, one, two = dogs_
    for dog in (zero, one):
        with dog.step(2):
            pass
    with zero.boundary(2):
        pass
    for dog in dogs_:  # as each rank's watchdog has long since (a stall may hold back the next beat)
        dog.publish()
    inside = contextlib.ExitStack()
    inside.enter_context(two.step(2))
    time.sleep(gap_s)
    inside.enter_context(one.boundary(2))
    inside.enter_context(zero.step(3))
    return inside


def test_the_rank_stuck_inside_a_step_the_others_finished_is_named_not_them():
    """Stuck after the step's last collective: the others finish the step and go on. Diagnosed by the
    stuck rank (overdue first where it entered first), the line names it alone, inside the step the
    others finished. On published beats: which rank's watchdog fires first is up to timing."""
    dogs_, _, _ = dogs(3, 0.3)
    with in_three_places(dogs_):
        for dog in dogs_:
            dog.publish()
        line, by_one = dogs_[2].diagnose(2), dogs_[1].diagnose(2)
    assert by_one.startswith("hang: stuck rank 2 on host ") and "rank 1 on host" not in by_one, by_one
    assert "it never started the end of iteration 2, which rank(s) 1 waited in for " in by_one, by_one
    assert line.startswith("hang: stuck rank 2 on host ") and "inside iteration 2 for " in line, line
    assert line.endswith("which rank(s) 0, 1 finished"), line


def test_three_ranks_in_three_places_end_in_one_line_naming_the_stuck_one():
    """The watchdogs running: every rank exits 76 with one line, and it names rank 2, whichever rank
    diagnosed (rank 2 by the time it has waited, or a rank stalled past its own timeout meanwhile)."""
    dogs_, exits, _ = dogs(3, 0.3)
    with in_three_places(dogs_, gap_s=0.2):  # rank 2 overdue first, unless the process stalls
        for thread in [watch(dog) for dog in dogs_]:
            thread.join(timeout=15)
    assert exits == [EXIT_HUNG] * 3 and len({dog.fired for dog in dogs_}) == 1
    fired, host = dogs_[0].fired, socket.gethostname()
    assert (
        fired.startswith("hang: stuck ") and f"rank 2 on host {host} (pid {os.getpid()}), last seen " in fired
    )
    assert "rank 0 on host" not in fired, fired


def stuck_in_step_2(zero: Watchdog, one: Watchdog, first: str, gap_s: float = 0.0) -> contextlib.ExitStack:
    """Rank 1 stuck in step 2 and rank 0 waiting in its end (both through step 1 and rank 0 through
    step 2), entered on the returned stack: the stuck rank first, or the waiting one, `gap_s` before
    the other."""
    through_step_1(zero, one)
    with zero.step(2):
        pass
    for dog in (zero, one):  # as each rank's watchdog has long since (a stall may hold back the next beat)
        dog.publish()
    inside = contextlib.ExitStack()
    order = [one.step(2), zero.boundary(2)] if first == "stuck" else [zero.boundary(2), one.step(2)]
    inside.enter_context(order[0])
    time.sleep(gap_s)
    inside.enter_context(order[1])
    return inside


@pytest.mark.parametrize("first", ["stuck", "waiting"])
def test_a_rank_stuck_in_a_step_is_named_while_the_others_wait_in_its_end(first):
    """Every rank but the stuck one finished step 2 and waits in its end's exchange (gloo every step,
    NCCL at each logged one): their beat was the stuck rank's, so the line said "all 2 ranks are
    inside iteration 2 ... a collective or a kernel is stuck" and named nobody. Whichever rank times
    out first (`first` diagnoses: the one that entered first), rank 1 is named; on published beats,
    since which watchdog fires first is up to timing."""
    (zero, one), _, _ = dogs(2, 0.3)
    with stuck_in_step_2(zero, one, first):
        zero.publish()
        one.publish()
        line = (one if first == "stuck" else zero).diagnose(2)
    host = socket.gethostname()
    assert line.startswith(
        f"hang: stuck rank 1 on host {host} (pid {os.getpid()}), last seen inside iteration 2"
    )
    if first == "stuck":
        assert "inside iteration 2 for " in line and line.endswith("which rank(s) 0 finished"), line
    else:
        assert "it never started the end of iteration 2, which rank(s) 0 waited in" in line, line


@pytest.mark.parametrize("first", ["stuck", "waiting"])
def test_a_rank_stuck_in_a_step_while_the_others_wait_in_its_end_ends_the_job_naming_it(first):
    """The watchdogs running: every rank exits 76 with one line naming rank 1, whichever diagnosed."""
    (zero, one), exits, _ = dogs(2, 0.3)
    with stuck_in_step_2(zero, one, first, gap_s=0.15):  # `first` overdue first, unless the process stalls
        for thread in [watch(zero), watch(one)]:
            thread.join(timeout=15)
    assert exits == [EXIT_HUNG] * 2 and zero.fired == one.fired
    fired = zero.fired
    assert fired.startswith(f"hang: stuck rank 1 on host {socket.gethostname()} (pid {os.getpid()})"), fired
    assert fired.endswith("which rank(s) 0 finished") or "which rank(s) 0 waited in" in fired, fired


def test_the_first_step_gets_more_time_and_the_time_between_steps_none():
    [dog], exits, _ = dogs(1, 0.1)
    thread = watch(dog)
    with dog.step(1):
        time.sleep(0.25)  # compile, NCCL setup, cache reads: within FIRST_STEP_FACTOR timeouts
    time.sleep(0.5)  # checkpoint save, validation
    with dog.step(2):
        pass
    dog.close()
    thread.join(timeout=5)
    assert exits == [] and dog.fired is None


def test_a_first_step_that_never_ends_is_caught_too():
    """A bad node at start, or after a requeue (communicators that never form, a dead data mount):
    the first step has FIRST_STEP_FACTOR timeouts, not none."""
    [dog], exits, _ = dogs(1, 0.1)
    thread = watch(dog)
    with dog.step(1):
        thread.join(timeout=15)
    assert exits == [EXIT_HUNG] and "iteration 1" in dog.fired


def test_the_end_of_the_first_step_gets_the_first_steps_time_too():
    """Its stop agreement waits for the slowest rank's first step (a node with a cold compile cache
    beside warm ones after a requeue): the larger budget, whichever iteration a resumed run starts at."""
    [dog], exits, _ = dogs(1, 0.1)
    thread = watch(dog)
    with dog.step(7):
        pass
    with dog.boundary(7):
        time.sleep(0.25)  # within FIRST_STEP_FACTOR timeouts
    dog.close()
    thread.join(timeout=5)
    assert exits == [] and dog.fired is None


def test_the_end_of_a_step_is_watched_as_the_step_is():
    """A log write on a hung file system holds every rank in the stop agreement, outside any step."""
    [dog], exits, _ = dogs(1, 0.1)
    with dog.step(1):
        pass
    thread = watch(dog)
    with dog.boundary(1):
        thread.join(timeout=15)
    assert exits == [EXIT_HUNG] and "iteration 1" in dog.fired


def test_a_rank_stuck_in_start_up_is_named_by_the_rank_waiting_at_its_end():
    """The ranks agree whether to train at start-up's end (a boundary before the first step); a rank
    still building its indices there is named, and the line says start-up, not a step's end."""
    (zero, one), exits, _ = dogs(2, 0.1)
    with zero.boundary(1, "start"):  # its first: FIRST_STEP_FACTOR timeouts
        for thread in [watch(zero), watch(one)]:
            thread.join(timeout=15)
    assert exits == [EXIT_HUNG] * 2
    assert zero.fired.startswith(
        "hang: stuck rank 1 (no heartbeat): it never started the end of start-up, before iteration 1,"
        " which rank(s) 0 waited in"
    ), zero.fired


def test_a_hang_inside_the_step_on_every_rank_says_so():
    (zero, one), exits, _ = dogs(2, 0.2)
    for dog in (zero, one):
        with dog.step(1):
            pass
    with zero.step(2), one.step(2):
        for thread in [watch(zero), watch(one)]:
            thread.join(timeout=15)
    assert exits == [EXIT_HUNG, EXIT_HUNG] and "all 2 ranks are inside iteration 2" in zero.fired


def test_a_rank_stuck_in_a_validation_batch_the_others_finished_is_named_in_words_of_validation():
    """Validation was not watched at all; each of its global batches now is, and the line says where."""
    (zero, one), exits, _ = dogs(2, 0.3)
    through_step_1(zero, one)
    with zero.evaluation(1, "validation", 1):
        pass
    threads = [watch(zero), watch(one)]
    with one.evaluation(1, "validation", 1):  # stuck (a GPU fault after the batch's collectives)
        time.sleep(0.15)
        with zero.evaluation(1, "validation", None):  # rank 0 waits in the closing reduction
            for thread in threads:
                thread.join(timeout=15)
    assert exits == [EXIT_HUNG] * 2 and zero.fired == one.fired
    host = socket.gethostname()
    assert zero.fired.startswith(
        f"hang: stuck rank 1 on host {host} (pid {os.getpid()}), last seen inside global batch 1 of the"
        " validation after iteration 1"
    ), zero.fired
    # rank 1's first evaluated batch has FIRST_STEP_FACTOR timeouts: rank 0 may diagnose first
    finished = (
        "inside global batch 1 of the validation after iteration 1 for 2 s (5 x trainer.hang_timeout_minutes,"
        " as a process's first evaluation), which rank(s) 0 finished"
    )
    waited = "it never started the end of the validation after iteration 1, which rank(s) 0 waited in"
    assert zero.fired.endswith(finished) or waited in zero.fired, zero.fired


def test_an_evaluation_given_up_inside_a_batch_is_not_watched_after_and_the_first_batch_gets_more_time():
    """A stop gives an evaluation up from inside its batch (EvaluationStopped); the save that follows
    may take long and is not watched. The process's first evaluated batch may compile its forward."""
    [dog], exits, _ = dogs(1, 0.1)
    with dog.step(1):
        pass
    thread = watch(dog)
    with dog.evaluation(1, "test split", 1):
        time.sleep(0.25)  # within FIRST_STEP_FACTOR timeouts
    with pytest.raises(RuntimeError), dog.evaluation(1, "test split", 2):
        raise RuntimeError("given up for a stop")
    time.sleep(0.5)  # the stop's checkpoint save
    dog.close()
    thread.join(timeout=5)
    assert exits == [] and dog.fired is None
    [dog], exits, _ = dogs(1, 0.1)
    with dog.evaluation(0, "validation", 1):
        pass
    with dog.evaluation(0, "validation", None):
        pass
    with dog.evaluation(1, "validation", 1):  # the second evaluation has the step's time
        thread = watch(dog)
        thread.join(timeout=15)
    assert exits == [EXIT_HUNG] and "inside global batch 1 of the validation after iteration 1" in dog.fired


def test_the_whole_first_evaluation_gets_the_first_batchs_time_and_the_next_one_the_steps():
    """A warm-cache rank finishes its first validation's batches and waits in the closing reduction
    for a cold-cache rank still compiling within its first batch's allowance: no hang there. The next
    evaluation's closing reduction has the step's time again."""
    [dog], exits, _ = dogs(1, 0.1)
    with dog.step(1):
        pass
    thread = watch(dog)
    for batch in (1, 2, None):
        with dog.evaluation(1, "validation", batch):
            time.sleep(0.25)  # within FIRST_STEP_FACTOR timeouts (rank 1 compiling meanwhile)
    assert exits == [] and dog.fired is None
    with dog.evaluation(2, "validation", None):
        thread.join(timeout=15)
    assert exits == [EXIT_HUNG] and "validation after iteration 2" in dog.fired


@pytest.mark.parametrize("first", ["iteration", "evaluation"])
def test_the_line_quotes_the_time_a_first_step_or_evaluation_was_given_not_the_steps(first):
    """A first step or evaluation waits FIRST_STEP_FACTOR timeouts, and its line read "for 600 s
    (trainer.hang_timeout_minutes)" after 50 minutes: the time quoted is the one waited."""
    [dog], exits, _ = dogs(1, 0.4)
    thread = watch(dog)
    with dog.step(1) if first == "iteration" else dog.evaluation(0, "validation", 1):
        thread.join(timeout=15)
    assert exits == [EXIT_HUNG]
    assert dog.fired.endswith(
        f"with no progress for 2 s (5 x trainer.hang_timeout_minutes, as a process's first {first}): a"
        " collective or a kernel is stuck (noticed by rank 0 on host " + socket.gethostname() + ")"
    ), dog.fired
    [dog], exits, _ = dogs(1, 0.4)  # the next ones: the step's time
    with dog.step(1), dog.evaluation(1, "validation", 1):
        pass
    thread = watch(dog)
    with dog.step(2) if first == "iteration" else dog.evaluation(2, "validation", 1):
        thread.join(timeout=15)
    assert exits == [EXIT_HUNG] and "for 0 s (trainer.hang_timeout_minutes):" in dog.fired, dog.fired


def gone_or_waiting(silent_s: float) -> str:
    """Rank 0's diagnosis after 10 minutes in iteration 5, where rank 1's beat (also inside 5) was last
    written `silent_s` ago."""
    store, now = FakeStore(), time.time()
    zero = Watchdog(0, 2, 600.0, store, exit_fn=lambda code: None, out=io.StringIO())
    beat = {"host": "n2", "pid": 42, "iteration": 5, "phase": "in", "section": 2, "time": now - 700}
    beat["seen"] = now - silent_s
    store.data[watchdog.beat_key(1)] = json.dumps(beat).encode()
    with zero.step(4), zero.step(5):
        zero.publish()
        return zero.diagnose(5)


def test_a_rank_that_died_inside_the_step_is_named_not_called_a_stuck_collective():
    """A rank SIGKILLed (the OOM killer) or lost with its node inside a step: NCCL's peers wait for it
    in the collective. Its last beat says "inside iteration 5" like theirs, so the line said every
    rank was in a stuck collective and named nobody; a live rank's beat is rewritten every sync."""
    message = gone_or_waiting(silent_s=650)
    assert message.startswith("hang: rank 1 on host n2 (pid 42), last seen inside iteration 5"), message
    assert "not heard from since (its process died, its node was lost, or it is frozen)" in message
    assert "while rank 0 waited in iteration 5" in message
    assert "all 2 ranks are inside iteration 5" in gone_or_waiting(silent_s=4)  # alive, waiting too


def test_a_store_gone_with_rank_0_names_rank_0_not_every_rank():
    """The beats are on rank 0's store: with rank 0 dead none can be read, and the line named every
    rank (this one included) as stuck with no heartbeat."""

    class GoneStore(FakeStore):
        def check(self, keys):
            raise RuntimeError("Connection reset by peer")

    one = Watchdog(1, 2, 600.0, GoneStore(), exit_fn=lambda code: None, out=io.StringIO())
    with one.step(4), one.step(5):
        message = one.diagnose(5)
    assert "cannot reach the job's store, which rank 0 serves: rank 0 is most likely gone" in message
    assert "rank 1 (no heartbeat)" not in message


def test_a_store_whose_server_is_gone_is_not_called_and_prints_no_cpp_stack(capfd):
    """With rank 0 dead, the peer's store calls (the watchdog's look for a posted hang, and the lost
    peer's diagnosis) printed c10d's warning with 20 frames of C++ stack (TCPStore.cpp: recvValue
    failed ... frame #0 ... frame #19) before gptrain's one line."""
    import torch.distributed as dist

    from gptrain.train.store_link import store_address

    server = dist.TCPStore("127.0.0.1", 0, 2, True, timedelta(seconds=10), wait_for_workers=False)
    client = dist.TCPStore("127.0.0.1", server.port, 2, False, timedelta(seconds=10))
    store = dist.PrefixStore("default_pg", dist.PrefixStore("0", client))  # as the default group's
    for rank in (0, 1):
        beat = {"host": "elsewhere", "pid": rank + 1, "iteration": 4, "phase": "in", "seen": time.time()}
        store.set(watchdog.beat_key(rank), json.dumps(beat))
    dog = Watchdog(1, 2, 600.0, store, exit_fn=lambda code: None, out=io.StringIO())
    assert store_address(store) == ("127.0.0.1", server.port) and dog.link.sock is not None
    assert not dog.link.closed() and dog.gone_peers() is None  # served: its beats are read
    assert sorted(dog.read_beats()) == [0, 1] and dog.peer_report() is None
    del server  # rank 0's process ends: it closes every connection to its store
    assert dog.link.closed(wait_s=5.0)
    assert dog.gone_peers() == "rank 0 (the job's store, which its process serves, cannot be reached)"
    assert dog.peer_report() is None and dog.read_beats() is None
    assert "rank 0 is most likely gone" in dog.hang_message(5)
    err = capfd.readouterr().err
    assert "recvValue failed" not in err and "frame #" not in err, err
    dog.close()
    assert (
        dog.link.sock is None and Watchdog(1, 2, 600.0, FakeStore()).link.sock is None
    )  # none: called as before


def test_looking_for_the_store_socket_never_changes_a_sockets_blocking_mode():
    """Wrapping a duplicate in a socket object under a process-wide socket.setdefaulttimeout() (any
    library may set one) set O_NONBLOCK on the open file description it shares with c10d's socket,
    changing c10d's own store connection under it."""
    import fcntl
    import socket

    from gptrain.train.store_link import connected_to

    ours, theirs = socket.socketpair()  # blocking: made before the default timeout is set
    before = fcntl.fcntl(ours.fileno(), fcntl.F_GETFL)
    assert not before & os.O_NONBLOCK
    socket.setdefaulttimeout(30.0)
    try:
        assert connected_to(ours.fileno(), {"127.0.0.1"}, 1) is None
    finally:
        socket.setdefaulttimeout(None)
    assert fcntl.fcntl(ours.fileno(), fcntl.F_GETFL) == before
    ours.close()
    theirs.close()


def test_a_training_step_makes_no_store_call_and_beats_are_rate_limited():
    """Issue 14 review: two blocking `store.set`s per step, every rank at once on rank 0's server."""
    [dog, _], _, store = dogs(2, 2.0)
    assert dog.sync_s == 0.4
    started = time.monotonic()
    thread = watch(dog)
    steps = 300  # at least 0.3 s: 600 store calls if each step wrote its two beats
    for step in range(1, steps + 1):
        with dog.step(step):
            time.sleep(0.001)
    last = f'"iteration": {steps}, "phase": "done"'  # the beat catches up within one interval
    waited = time.monotonic()
    while (
        last not in store.data.get("gptrain/watchdog/rank0", b"").decode() and time.monotonic() - waited < 5
    ):
        time.sleep(0.05)
    dog.close()
    thread.join(timeout=5)
    elapsed = time.monotonic() - started
    assert store.calls[threading.current_thread().name] == 0
    # a sync (a beat and a look for a posted hang) at the thread's start, then none sooner than sync_s
    # after the last: the bound holds however slowly a loaded machine runs the steps
    assert 1 <= store.calls["watchdog-0"] <= 2 * (1 + elapsed / dog.sync_s)
    assert last in store.data["gptrain/watchdog/rank0"].decode()
    assert Watchdog(0, 1024, 600.0).sync_s == 5.0  # the default 10 minutes: a beat every 5 s at most


def global_hang(world: int, stuck: int, timeout_s: float, store: FakeStore) -> tuple[list[Watchdog], list]:
    """Every rank but `stuck` waits inside iteration 2; returns the dogs and their (exit code, acks)."""
    exits: list[tuple[int, int]] = []
    made = [
        Watchdog(
            r,
            world,
            timeout_s,
            store,
            exit_fn=lambda c: exits.append((c, int(store.data[ACK_KEY]))),
            out=io.StringIO(),
        )
        for r in range(world)
    ]
    threads = [watch(dog) for dog in made]
    for dog in made:
        with dog.step(1):
            pass
    with contextlib.ExitStack() as inside:
        for dog in made:
            if dog.rank != stuck:
                inside.enter_context(dog.step(2))
        for thread in threads:
            thread.join(timeout=15)
    return made, exits


def test_a_hang_seen_by_every_rank_at_once_is_diagnosed_by_one_rank_in_two_store_calls():
    """Issue 14 review: each rank that timed out read every heartbeat (2 x world calls, world x world in all)."""
    store = FakeStore()
    made, exits = global_hang(64, 5, 0.5, store)
    assert [code for code, _ in exits] == [EXIT_HUNG] * 64
    assert len({dog.fired for dog in made}) == 1 and "stuck rank 5 on host" in made[0].fired
    assert "last seen finishing iteration 1" in made[0].fired
    assert store.beat_reads <= 2  # one check of all keys, one multi_get
    assert max(store.calls.values()) < 30  # no rank polls the store in a loop


def test_every_rank_acknowledges_before_any_exits_however_long_the_diagnosis_takes(monkeypatch):
    """The grace period counts from the posted line: a slow diagnosis must not make the first rank leave
    alone (under srun, the others would then be killed: exit 137, which is not requeued)."""
    monkeypatch.setattr(watchdog, "GRACE_SECONDS", 0.5)
    store = FakeStore()
    store.beat_read_s = 0.05  # rank 0's server, busy: 8 ranks reading every beat took 6.4 s at 256 ranks
    made, exits = global_hang(8, 3, 0.3, store)
    assert exits == [(EXIT_HUNG, 8)] * 8  # each rank exits once all 8 have acknowledged
    assert "stuck rank 3 on host" in made[0].fired


def test_a_real_tcpstore_rank_without_any_heartbeat_is_named():
    """The store calls as torch's TCPStore answers them (check, multi_get, wait with a timeout, compare_set)."""
    import torch.distributed as dist

    world, exits = 4, []
    server = dist.TCPStore(
        "127.0.0.1", 0, world + 1, True, timeout=timedelta(seconds=20), wait_for_workers=False
    )
    clients = [
        dist.TCPStore("127.0.0.1", server.port, world + 1, False, timeout=timedelta(seconds=20))
        for _ in range(world)
    ]
    made = [
        Watchdog(r, world, 0.5, clients[r], exit_fn=exits.append, out=io.StringIO()) for r in range(world)
    ]
    threads = [watch(dog) for dog in made]
    with contextlib.ExitStack() as inside:
        for dog in made[1:]:  # rank 0 never reaches its first step
            with dog.step(1):
                pass
            inside.enter_context(dog.step(2))
        for thread in threads:
            thread.join(timeout=15)
    assert exits == [EXIT_HUNG] * world and len({dog.fired for dog in made}) == 1
    assert (
        "hang: stuck rank 0 (no heartbeat): it never started iteration 2, which rank(s) 1, 2, 3"
        in made[1].fired
    )


def test_disabled_watchdog_does_nothing():
    dog = Watchdog.start(0, rank=0, world_size=1)
    with dog.step(1), dog.step(2):
        pass
    assert dog._thread is None and dog.fired is None


@pytest.mark.distributed
@pytest.mark.slow
def test_a_rank_stopped_in_validation_ends_the_job_naming_it(tmp_path):
    """Validation ran outside any watch: the other rank waited in its collective until the process
    group's timeout (65 minutes with the defaults), then died of NCCL's abort (134, not requeued)
    without naming the rank. Now its global batches are watched as a step is. Rank 1's validation
    data never comes (a hung data mount)."""
    hooked = [sys.executable, str(Path(__file__).with_name("rank_hooks.py")), "stop-in-validation", "1"]
    settings = ["trainer.max_steps=100", "trainer.hang_timeout_minutes=0.05"]  # 3 s
    validation = ["trainer.val_check_interval=3", "trainer.limit_val_batches=2"]
    started = time.monotonic()
    processes = start_ranks(tmp_path / "run", [*settings, *validation], program=hooked)
    outputs = finish_ranks(processes, timeout=120)
    assert time.monotonic() - started < 100
    assert [p.returncode for p in processes] == [EXIT_HUNG, EXIT_HUNG], outputs[0][1][-3000:]
    host = socket.gethostname()
    for _, err in outputs:
        line = next(x for x in err.splitlines() if "hang: " in x)
        assert line.startswith("gptrain: rank ") and f"hang: stuck rank 1 on host {host}" in line, line
        assert f"(pid {processes[1].pid}), last seen inside global batch 1 of the validation after" in line, (
            line
        )
        assert "after iteration 3, loading its micro-batches (" in line, line  # watched from its first read
        assert (
            "which rank(s) 0 finished, waiting in global batch 1 of the validation after iteration 3" in line
        )


@pytest.mark.distributed
@pytest.mark.slow
def test_two_gloo_ranks_one_stops_the_job_ends_naming_it_and_resumes(tmp_path):
    log_dir = tmp_path / "run"
    hang = ["trainer.max_steps=1000", "trainer.hang_timeout_minutes=0.05"]  # 3 s
    started = time.monotonic()
    processes = start_ranks(log_dir, hang, **{TEST_HOOK: "1:4"})  # rank 1 stops before iteration 4
    outputs = [p.communicate(timeout=240) for p in processes]
    elapsed = time.monotonic() - started
    assert [p.returncode for p in processes] == [EXIT_HUNG, EXIT_HUNG], outputs[0][1][-3000:]
    host = socket.gethostname()
    for _, err in outputs:
        line = next(x for x in err.splitlines() if "hang: stuck rank 1" in x)
        assert f"on host {host} (pid {processes[1].pid}), last seen finishing iteration 3" in line
        assert "never started iteration 4, which rank(s) 0 waited in" in line and f"exit {EXIT_HUNG}" in line
    assert elapsed < 120
    assert (log_dir / "checkpoints" / "latest").read_text().strip() == "step_2"
    # what the requeued job does: the same command resumes from the last checkpoint
    processes = start_ranks(log_dir, ["trainer.max_steps=4"])
    outputs = [p.communicate(timeout=240) for p in processes]
    assert [p.returncode for p in processes] == [0, 0], outputs[0][1][-3000:]
    assert "resuming from" in (log_dir / "nemo_log_globalrank-0_localrank-0.txt").read_text()


def test_the_hang_line_goes_into_the_run_log_and_a_hung_log_does_not_hold_the_exit():
    """Before, the line went to stderr only: a run directory's log just stopped before each resume."""
    dog = Watchdog(0, 1, 0.3, None, exit_fn=lambda code: None, out=io.StringIO())
    written: list[str] = []
    dog.note = written.append
    dog.end("hang: test")
    assert written == [dog.out.getvalue().strip()] and "exit 76" in written[0]
    released = threading.Event()
    dog.note = lambda line: released.wait(30)  # a log file on a hung mount
    started = time.monotonic()
    dog.write_note("x", timeout_s=0.2)
    assert time.monotonic() - started < 5
    released.set()


def test_a_hang_of_a_run_without_checkpoints_is_not_requeued():
    """The batch script requeues exit 76; with checkpoints off the requeued job started over."""
    codes: list[int] = []
    dog = Watchdog(0, 1, 0.3, None, exit_fn=codes.append, out=io.StringIO())
    dog.requeue = False
    dog.end("hang: test")
    assert codes == [1] and "checkpoints are off, so the job is not requeued" in dog.out.getvalue()


@pytest.mark.parametrize("hang_minutes", [0.5, 1, 6, 10, 30, 120])
def test_collectives_outlive_the_watchdogs_first_step_allowance(hang_minutes, monkeypatch):
    """A rank stuck in its first step is the watchdog's to report (a line, exit 76, requeued): the
    process group's timeout must come after FIRST_STEP_FACTOR timeouts, the diagnosis and the grace,
    or NCCL aborts the job first (SIGABRT, exit 134). It was 2 timeouts: 20 min for a 50 min allowance."""
    from gptrain.config import load_training_config
    from gptrain.parallel.mesh import World
    from gptrain.train import loop

    watchdog_s = (
        watchdog.FIRST_STEP_FACTOR * hang_minutes * 60
        + watchdog.DIAGNOSIS_WAIT_SECONDS
        + watchdog.GRACE_SECONDS
        + watchdog.SYNC_MAX_SECONDS
    )
    assert watchdog.collective_timeout_minutes(hang_minutes) * 60 > watchdog_s
    given = []

    def init_distributed(world, accelerator, timeout_minutes):
        given.append(timeout_minutes)
        raise KeyboardInterrupt  # stop train() there

    monkeypatch.setattr(loop, "world_from_env", lambda: World(0, 2, 0, "127.0.0.1", 0))
    monkeypatch.setattr(loop, "init_distributed", init_distributed)
    overrides = [
        f"trainer.hang_timeout_minutes={hang_minutes}",
        "trainer.devices=2",
        "model.global_batch_size=8",
        "model.data.data_impl=mock",  # no corpus: train() checks the data before the process group
    ]
    cfg = load_training_config("quickstart/cpu", overrides)  # a layout two ranks can hold
    with pytest.raises(KeyboardInterrupt):
        loop.train(cfg)
    assert given == [watchdog.collective_timeout_minutes(hang_minutes)]
