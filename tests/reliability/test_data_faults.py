"""Faults in a run's data and its cached sample indices, met at the start of a run: one line
naming the file or key and what to do, never a traceback."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest
from reliability_helpers import train_args

from gptrain.cli import main
from gptrain.train import step_loop

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")


def test_an_index_cache_that_cannot_be_written_names_the_key_to_change(tmp_path, capsys, indexed_corpus):
    """The line said `--cache-dir / data.cache_dir`, a flag of `data sample` and a key no config has."""
    (tmp_path / "file").write_text("not a directory")
    args = train_args(
        tmp_path / "run",
        *indexed_corpus,
        "model.data.data_impl=mmap",
        f"model.data.index_mapping_dir={tmp_path / 'file' / 'index'}",
    )
    assert main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("gptrain: error: cannot write dataset index cache in "), err
    assert "model.data.index_mapping_dir" in err[0] and "data.cache_dir" not in err[0].replace(
        "model.data.index_mapping_dir", ""
    )


def own_children() -> list[int]:
    """The pids of this process's children (its DataLoader workers, in a test)."""
    pids = []
    for children in Path("/proc/self/task").glob("*/children"):
        pids += [int(pid) for pid in children.read_text().split()]
    return pids


def test_a_loader_worker_killed_by_the_oom_killer_is_one_line(tmp_path, capsys, monkeypatch, indexed_corpus):
    """The kernel's OOM killer takes a DataLoader worker (SIGKILL): torch's RuntimeError and the broken
    connection beneath it were printed as two tracebacks of some 60 lines, exit 1."""
    real_record = step_loop.record

    def record_then_kill_the_workers(s, result, *args):
        real_record(s, result, *args)
        if s.state.step == 2:
            for pid in own_children():
                os.kill(pid, signal.SIGKILL)
            time.sleep(0.5)  # the SIGCHLD reaches the loader before its next batch

    monkeypatch.setattr(step_loop, "record", record_then_kill_the_workers)
    args = train_args(tmp_path / "run", *indexed_corpus, "trainer.max_steps=6", "model.data.num_workers=1")
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err, err[-3000:]
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("gptrain: error: a DataLoader worker (pid "), lines
    assert "killed by signal Killed" in lines[0] and "out-of-memory" in lines[0]
    assert "model.data.num_workers" in lines[0] and "resume" in lines[0]


def test_torchs_words_for_a_worker_gone_without_a_signal_are_one_line_too():
    from gptrain.train.batches import loader_worker_died

    died = loader_worker_died(RuntimeError("DataLoader worker (pid(s) 123, 456) exited unexpectedly"))
    assert died is not None and str(died).startswith(
        "a DataLoader worker (pid 123, 456) exited unexpectedly: "
    )
    segfault = loader_worker_died(
        RuntimeError("DataLoader worker (pid 7) is killed by signal: Segmentation fault. ")
    )
    assert (
        segfault is not None
        and "signal Segmentation fault:" in str(segfault)
        and "out-of-memory" not in str(segfault)
    )
    assert loader_worker_died(RuntimeError("CUDA error: device-side assert triggered")) is None


def test_each_way_a_worker_dies_gets_its_own_remedy():
    """Every death was told to add host memory: a SIGBUS (torch's own message says the workers ran
    out of shared memory: /dev/shm in a container) and an exit code (lost) were misdirected."""
    from gptrain.train.batches import loader_worker_died

    bus = loader_worker_died(
        RuntimeError(
            "DataLoader worker (pid 9) is killed by signal: Bus error. It is possible that dataloader's "
            "workers are out of shared memory. Please try to raise your shared memory limit."
        )
    )
    assert bus is not None and "/dev/shm" in str(bus) and "host memory" not in str(bus)
    code = loader_worker_died(
        RuntimeError(
            "DataLoader worker (pid 77) exited unexpectedly with exit code 3. Details are lost due to "
            "multiprocessing. Rerunning with num_workers=0 may give better error trace."
        )
    )
    assert code is not None and str(code).startswith(
        "a DataLoader worker (pid 77) exited unexpectedly with exit code 3: "
    )
    assert "model.data.num_workers=0" in str(code) and "host memory" not in str(code)
    segfault = loader_worker_died(
        RuntimeError("DataLoader worker (pid 7) is killed by signal: Segmentation fault. ")
    )
    assert segfault is not None and "host memory" not in str(segfault)


def test_a_broken_connection_seen_before_the_workers_death_waits_for_torchs_check(monkeypatch):
    """The worker's socket can close before the kernel shows it exited: the run then met EOFError or
    'Connection reset by peer' (printed as that, one line saying nothing of the worker), and torch's
    SIGCHLD handler raised the death later, from the run's cleanup, as a traceback."""
    import torch

    from gptrain.train.batches import loader_worker_died

    checks = []

    def dead_on_the_third_look():
        checks.append(1)
        if len(checks) == 3:
            raise RuntimeError("DataLoader worker (pid 42) is killed by signal: Killed. ")

    monkeypatch.setattr(torch._C, "_error_if_any_worker_fails", dead_on_the_third_look)
    died = loader_worker_died(ConnectionResetError(104, "Connection reset by peer"), wait_s=5.0)
    assert died is not None and "(pid 42) was killed by signal Killed" in str(died) and len(checks) == 3
    checks.clear()
    assert loader_worker_died(EOFError(), wait_s=0.0) is None  # no death seen: the error stays itself
