"""The hang watchdog in a checkpoint save and in a rank's data loading (session 27).

A synchronous save ran outside any watch: a rank whose write never returned (a dead file system)
held the others in the save's collective until the process group's timeout (65 minutes with the
defaults), then NCCL's abort (SIGABRT, exit 134, not requeued) ended the job naming nobody.
"""

from __future__ import annotations

import socket
import sys
import threading
import time
from pathlib import Path

import pytest
from reliability_helpers import finish_ranks, start_ranks
from test_watchdog import dogs, through_step_1, watch

from gptrain.errors import EXIT_HUNG
from gptrain.train import watchdog
from gptrain.train.saving import save_allowance_s

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")

HOOKS = str(Path(__file__).with_name("rank_hooks.py"))
GB = 10**9


def hang_lines(tmp_path: Path, settings: list[str], hooked: list[str]) -> tuple[list, list[str]]:
    """Two ranks of `hooked` under `settings` to their end: both must exit 76 (EXIT_HUNG); each rank's
    hang line."""
    processes = start_ranks(tmp_path / "run", settings, program=hooked)
    outputs = finish_ranks(processes, timeout=120)
    assert [p.returncode for p in processes] == [EXIT_HUNG, EXIT_HUNG], outputs[0][1][-3000:]
    return processes, [next(x for x in err.splitlines() if "hang: " in x) for _, err in outputs]


def test_a_save_gets_five_timeouts_or_its_bytes_at_a_slow_file_systems_speed():
    assert save_allowance_s(10, 16 * GB) == 50 * 60  # the default timeout's 5: more than 16 GB needs
    assert save_allowance_s(1, 16 * GB) == 16 * GB / 25e6 == 640  # a 1.3B model's whole state
    assert save_allowance_s(1, 22 * GB) == 880  # a rank's share of 175B under TP8 x PP16
    assert save_allowance_s(0.05, 1000) == 15  # the tests' 3 s timeout


@pytest.mark.parametrize("hang_minutes", [0.05, 1, 10, 30, 120])
def test_a_save_is_ended_by_the_watchdog_before_the_process_groups_timeout(hang_minutes):
    """Past the group's timeout NCCL's abort (exit 134, not requeued) would end the save first."""
    allowance = save_allowance_s(hang_minutes, 10**15)  # a petabyte: the cap
    watchdog_s = (
        allowance + watchdog.DIAGNOSIS_WAIT_SECONDS + watchdog.GRACE_SECONDS + watchdog.SYNC_MAX_SECONDS
    )
    assert watchdog_s < 60 * watchdog.collective_timeout_minutes(hang_minutes)
    assert allowance >= watchdog.FIRST_STEP_FACTOR * 60 * hang_minutes


def test_a_rank_still_busy_where_the_others_wait_in_the_same_section_is_named_with_what_it_does():
    """Every rank inside the same section read "all N ranks are inside ...", naming nobody."""
    (zero, one), exits, _ = dogs(2, 0.2)
    through_step_1(zero, one)
    threads = [watch(zero), watch(one)]
    with zero.saving(1, 0.3), one.saving(1, 0.3), one.doing("writing its checkpoint files"):
        for thread in threads:
            thread.join(timeout=15)
    assert exits == [EXIT_HUNG] * 2 and zero.fired == one.fired
    assert zero.fired.startswith(f"hang: stuck rank 1 on host {socket.gethostname()} (pid "), zero.fired
    assert "last seen inside the checkpoint save of iteration 1, writing its checkpoint files (" in zero.fired
    assert zero.fired.endswith(
        "still at it after 0 s (the save's allowance), which rank(s) 0 finished, waiting in the checkpoint"
        " save of iteration 1"
    ), zero.fired
    (zero, one), exits, _ = dogs(2, 0.2)  # both busy: nobody to single out
    through_step_1(zero, one)
    threads = [watch(zero), watch(one)]
    with (
        zero.step(2),
        one.step(2),
        zero.doing("loading its micro-batches"),
        one.doing("loading its micro-batches"),
    ):
        for thread in threads:
            thread.join(timeout=15)
    assert "hang: all 2 ranks are inside iteration 2" in zero.fired, zero.fired


@pytest.mark.parametrize("async_save", [False, True])
def test_a_save_notes_only_the_ranks_own_work_each_cleared_before_a_collective(tmp_path, async_save):
    """Noted from before DCP's plan gather, a rank waiting there for a peer read as the one stuck."""
    import torch

    from gptrain.checkpoint.checksum_writer import PREPARING, WRITING
    from gptrain.checkpoint.manager import CheckpointManager

    notes = []
    manager = CheckpointManager(tmp_path, keep_last=-1, async_save=async_save)
    manager.note = notes.append
    manager.save(2, {"model": {"w": torch.ones(2)}}, {"rng": torch.tensor([1])})
    manager.close()
    own = [PREPARING] * 3  # rank 0's clearing of the step, its lstat, its mkdir
    if not async_save:
        own += [PREPARING, WRITING, "writing the checkpoint's metadata", "marking its checkpoint complete"]
    else:  # a background write outlasts the save's watch: noted only while close() waits for it
        waited, notes = notes[6:], notes[:6]
        marking = "waiting for its background thread marking step_2 complete"  # rank 0's own too
        assert set(waited) <= {"waiting for its background write of step_2", marking, None}, waited
        assert waited[-1] is None, waited
    assert notes == [x for what in own for x in (what, None)], notes


def test_a_background_writes_own_work_is_noted_only_while_the_training_thread_waits_for_it():
    """The wait for a rank's own previous background write read as a wait for the others: a rank whose
    write hung was not named, every rank being inside the next save (review A, item 1)."""
    from gptrain.checkpoint.checksum_writer import PREPARING, WRITING, OwnWork

    notes = []
    own = OwnWork()
    own(WRITING)  # training goes on beside the write: not noted
    assert notes == []
    with own.waited_for(notes.append, "step_2"):  # busy as the wait begins
        assert notes == ["waiting for its background write of step_2"]
        own(None)  # its files written: its writer waits in DCP's gather for a peer's
        assert notes[-1] is None
        own(PREPARING)
        assert notes[-1] == "waiting for its background write of step_2"
    assert notes[-1] is None  # cleared before the collective that agrees on the write
    own(WRITING)
    assert notes == [
        "waiting for its background write of step_2",
        None,
        "waiting for its background write of step_2",
        None,
    ]
    own(None)
    with own.waited_for(notes.append, "step_4"):  # idle: a wait for the others, not noted
        assert notes[-1] is None and len(notes) == 4
    with own.waited_for(None, "step_4"):  # no watchdog (gptrain eval, tests)
        own(WRITING)


def test_rank_0s_background_marking_is_noted_as_its_own_work_while_the_training_thread_waits_for_it():
    """Rank 0's marking thread (manifest, COMPLETE, latest, pruning) runs after every rank's write; a
    training thread waiting on a marking that hangs (a stalled mount) was noted busy with nothing."""
    from concurrent.futures import Future

    from gptrain.checkpoint.background_save import marked_when_written
    from gptrain.checkpoint.checksum_writer import OwnWork
    from gptrain.checkpoint.save_report import SaveReport

    own, notes, marking, release = OwnWork(), [], threading.Event(), threading.Event()
    upload: Future = Future()
    upload.set_result(None)  # every rank's files written

    def mark() -> None:
        marking.set()
        release.wait(10)

    report = SaveReport(2, Path("step_2"), 0.0, 0.0, True)
    marked = marked_when_written(upload, mark, report, time.perf_counter(), own)
    assert marking.wait(10)
    with own.waited_for(notes.append, "step_2"):
        assert notes == ["waiting for its background thread marking step_2 complete"], notes
        release.set()
        marked.result(10)
        assert notes[-1] is None  # marked: the wait goes on to the save's agreement
    assert notes[-1] is None


@pytest.mark.distributed
@pytest.mark.slow
def test_rank_0_whose_background_marking_never_returns_is_named_at_the_next_save(tmp_path):
    """Rank 0's COMPLETE of step 2 never gets written; at the next save rank 0 waits for its marking
    while rank 1 waits in the save's agreement. The line read "all 2 ranks are inside the checkpoint
    save of iteration 4", naming nobody."""
    hooked = [sys.executable, HOOKS, "complete-hangs", "2"]
    settings = [
        "trainer.max_steps=100",
        "trainer.hang_timeout_minutes=0.05",  # 3 s
        "exp_manager.checkpoint_callback_params.async_save=true",
    ]
    processes, lines = hang_lines(tmp_path, settings, hooked)
    host = socket.gethostname()
    for line in lines:
        assert f"hang: stuck rank 0 on host {host} (pid {processes[0].pid}), last seen inside the" in line, (
            line
        )
        assert "save of iteration 4, waiting for its background thread marking step_2 complete (" in line, (
            line
        )
        assert "which rank(s) 1 finished, waiting in the checkpoint save of iteration 4" in line, line


@pytest.mark.distributed
@pytest.mark.slow
def test_a_rank_whose_checkpoint_write_never_returns_ends_the_job_naming_it(tmp_path):
    """Rank 1's write of step 2's checkpoint never returns; rank 0 wrote its files and waits in the
    save's collective. The save's allowance here is FIRST_STEP_FACTOR x 3 s (its state is tiny)."""
    hooked = [sys.executable, HOOKS, "stop-in-save", "1", "2"]
    settings = [
        "trainer.max_steps=100",
        "trainer.hang_timeout_minutes=0.05",  # 3 s
        "exp_manager.checkpoint_callback_params.async_save=false",
    ]
    started = time.monotonic()
    processes, lines = hang_lines(tmp_path, settings, hooked)
    assert time.monotonic() - started < 100
    host = socket.gethostname()
    for line in lines:
        assert line.startswith("gptrain: rank ") and f"hang: stuck rank 1 on host {host}" in line, line
        assert f"(pid {processes[1].pid}), last seen inside the checkpoint save of iteration 2" in line, line
        assert "writing its checkpoint files" in line and "which rank(s) 0 finished" in line, line


@pytest.mark.distributed
@pytest.mark.slow
def test_a_rank_hung_before_its_checkpoint_write_is_named_not_the_ranks_waiting_for_it(tmp_path):
    """Rank 1's mkdir of step 2's directory never returns (a stalled mount); rank 0 waits in DCP's plan
    gather. Each rank was noted writing its files from before that gather: the line named rank 0, the
    healthy one, as stuck writing, and rank 1 as finished (review X1)."""
    hooked = [sys.executable, HOOKS, "stop-in-save-mkdir", "1", "2"]
    settings = [
        "trainer.max_steps=100",
        "trainer.hang_timeout_minutes=0.05",  # 3 s
        "exp_manager.checkpoint_callback_params.async_save=false",
    ]
    processes, lines = hang_lines(tmp_path, settings, hooked)
    host = socket.gethostname()
    for line in lines:
        assert f"hang: stuck rank 1 on host {host} (pid {processes[1].pid}), last seen inside the" in line, (
            line
        )
        assert "checkpoint save of iteration 2, preparing its checkpoint directory (" in line, line
        assert "which rank(s) 0 finished, waiting in the checkpoint save of iteration 2" in line, line


@pytest.mark.distributed
@pytest.mark.slow
def test_a_rank_whose_parallel_validation_loader_hangs_is_named_as_loading(tmp_path):
    """Under TP the evaluation draws each global batch's micro-batches inside the batch's watch, then
    runs them through the layout's forward (a collective): rank 1's loader never delivers (a hung data
    mount) while rank 0 waits in that forward. Both were inside global batch 1, and the line said
    "all 2 ranks are inside global batch 1 ...: a collective or a kernel is stuck", naming nobody."""
    hooked = [sys.executable, HOOKS, "stop-in-validation", "1"]
    settings = ["trainer.max_steps=100", "trainer.hang_timeout_minutes=0.05"]  # 3 s
    validation = ["trainer.val_check_interval=3", "trainer.limit_val_batches=2"]
    layout = ["model.tensor_model_parallel_size=2"]
    processes, lines = hang_lines(tmp_path, [*settings, *validation, *layout], hooked)
    host = socket.gethostname()
    for line in lines:
        assert (
            f"hang: stuck rank 1 on host {host} (pid {processes[1].pid}), last seen inside global batch 1"
            in line
        )
        assert "of the validation after iteration 3, loading its micro-batches" in line, line
        assert "which rank(s) 0 finished, waiting in global batch 1 of the validation" in line, line


@pytest.mark.distributed
@pytest.mark.slow
def test_a_rank_whose_training_loader_hangs_is_named_as_loading(tmp_path):
    """A step draws its global batch inside the step's watch, then its gradients are all-reduced: rank
    1's loader never delivers iteration 4's batch while rank 0 waits in that all-reduce."""
    hooked = [sys.executable, HOOKS, "stop-in-train-load", "1", "4"]
    settings = ["trainer.max_steps=100", "trainer.hang_timeout_minutes=0.05"]  # 3 s
    processes, lines = hang_lines(tmp_path, settings, hooked)
    host = socket.gethostname()
    for line in lines:
        assert (
            f"hang: stuck rank 1 on host {host} (pid {processes[1].pid}), last seen inside iteration 4"
            in line
        )
        assert "inside iteration 4, loading its micro-batches (" in line, line
        assert "which rank(s) 0 finished, waiting in iteration 4" in line, line


@pytest.mark.distributed
@pytest.mark.slow
@pytest.mark.parametrize("stopped", ["1", "-1"])
def test_a_rank_whose_local_validation_loader_hangs_is_named_as_loading(tmp_path, stopped):
    """Without TP/PP the evaluation drew each global batch's first micro-batch before the batch's watch:
    a loader hung there left its rank in no section, and every rank's loader hung at once (-1: a dead
    shared data mount) fired nothing until Slurm's time limit. Now drawn inside global batch 1's watch."""
    hooked = [sys.executable, HOOKS, "stop-in-validation", stopped]
    settings = ["trainer.max_steps=100", "trainer.hang_timeout_minutes=0.05"]  # 3 s
    validation = ["trainer.val_check_interval=3", "trainer.limit_val_batches=2"]
    processes, lines = hang_lines(tmp_path, [*settings, *validation], hooked)
    host = socket.gethostname()
    for line in lines:
        if stopped == "-1":  # both busy loading: nobody to single out, but the hang is caught
            assert "hang: all 2 ranks are inside global batch 1 of the validation after iteration 3" in line
            continue
        assert (
            f"hang: stuck rank 1 on host {host} (pid {processes[1].pid}), last seen inside global batch 1"
            in line
        ), line
        assert "of the validation after iteration 3, loading its micro-batches" in line, line


@pytest.mark.distributed
@pytest.mark.slow
def test_a_rank_whose_background_checkpoint_write_never_returns_is_named_at_the_next_save(tmp_path):
    """Rank 1's background write of step 2's checkpoint never returns; training goes on, and at the next
    save every rank waits for its previous write (rank 0's in DCP's gather of rank 1's results). The
    line read "all 2 ranks are inside the checkpoint save of iteration 4", naming nobody."""
    hooked = [sys.executable, HOOKS, "stop-in-save", "1", "2"]
    settings = [
        "trainer.max_steps=100",
        "trainer.hang_timeout_minutes=0.05",  # 3 s
        "exp_manager.checkpoint_callback_params.async_save=true",
    ]
    processes, lines = hang_lines(tmp_path, settings, hooked)
    host = socket.gethostname()
    for line in lines:
        assert f"hang: stuck rank 1 on host {host} (pid {processes[1].pid}), last seen inside the" in line, (
            line
        )
        assert "checkpoint save of iteration 4, waiting for its background write of step_2 (" in line, line
        assert "which rank(s) 0 finished, waiting in the checkpoint save of iteration 4" in line, line
