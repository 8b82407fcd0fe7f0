"""Issue 14, case 8: a rank that stops ends the job within the hang timeout, naming it, with exit 76.

Before, the other rank waited in the gradient all-reduce until torch's collective timeout
(30 minutes here) and died with an opaque gloo error naming nobody.
"""

from __future__ import annotations

import io
import os
import socket
import threading
import time

import pytest
from reliability_helpers import start_ranks

from gptrain.errors import EXIT_HUNG
from gptrain.train.watchdog import TEST_HOOK, Watchdog

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")


class FakeStore:
    """The four TCPStore calls the watchdog uses, in memory."""

    def __init__(self) -> None:
        self.data: dict[str, bytes] = {}
        self.lock = threading.Lock()

    def set(self, key: str, value: str) -> None:
        with self.lock:
            self.data[key] = value.encode()

    def get(self, key: str) -> bytes:
        with self.lock:
            return self.data[key]

    def check(self, keys: list[str]) -> bool:
        with self.lock:
            return all(k in self.data for k in keys)

    def add(self, key: str, amount: int) -> int:
        with self.lock:
            value = int(self.data.get(key, b"0")) + amount
            self.data[key] = str(value).encode()
            return value

    def compare_set(self, key: str, expected: str, desired: str) -> bytes:
        with self.lock:
            if self.data.get(key, b"") == expected.encode():
                self.data[key] = desired.encode()
            return self.data[key]


def dogs(world: int, timeout_s: float) -> tuple[list[Watchdog], list[int], FakeStore]:
    store, exits = FakeStore(), []
    made = [
        Watchdog(r, world, timeout_s, store, exit_fn=exits.append, out=io.StringIO()) for r in range(world)
    ]
    return made, exits, store


def watch(dog: Watchdog) -> threading.Thread:
    thread = threading.Thread(target=dog.watch, daemon=True)
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


def test_the_first_step_and_the_time_between_steps_are_not_timed():
    [dog], exits, _ = dogs(1, 0.1)
    thread = watch(dog)
    with dog.step(1):
        time.sleep(0.5)  # compile, NCCL setup, cache reads
    time.sleep(0.5)  # checkpoint save, validation
    with dog.step(2):
        pass
    dog.close()
    thread.join(timeout=5)
    assert exits == [] and dog.fired is None


def test_a_hang_inside_the_step_on_every_rank_says_so():
    (zero, one), exits, _ = dogs(2, 0.2)
    for dog in (zero, one):
        with dog.step(1):
            pass
    with zero.step(2), one.step(2):
        for thread in [watch(zero), watch(one)]:
            thread.join(timeout=15)
    assert exits == [EXIT_HUNG, EXIT_HUNG] and "all 2 ranks are inside iteration 2" in zero.fired


def test_disabled_watchdog_does_nothing():
    dog = Watchdog.start(0, rank=0, world_size=1)
    with dog.step(1), dog.step(2):
        pass
    assert dog._thread is None and dog.fired is None


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
