"""A results file the file system refuses (a full disk) is said once; the run goes on."""

from __future__ import annotations

import errno

from gptrain.train.results import RunLog, Scalars


class FullDisk:
    """A file or SummaryWriter whose writes fail as on a full disk."""

    def __init__(self) -> None:
        self.calls = 0

    def _fail(self, *args, **kwargs):
        self.calls += 1
        raise OSError(errno.ENOSPC, "No space left on device", "/results/events.out.tfevents.1")

    write = add_scalar = add_text = flush = close = _fail

    def get_logdir(self) -> str:
        return "/results"


def test_tensorboard_on_a_full_disk_is_given_up_with_one_warning(tmp_path, capsys):
    """Before, the writer thread's ENOSPC came back as a traceback from the next add_scalar, and
    again from close() in the loop's `finally`, which then skipped closing the log."""
    scalars = Scalars(tmp_path, enabled=False)
    scalars._writer = full = FullDisk()
    scalars.add({"lm loss": 1.0, "grad norm": 2.0}, 1)
    scalars.add_vs_samples({"lm loss vs samples": 1.0}, 8, 1)
    scalars.text("warning", "x", 1)
    scalars.close()
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        "gptrain: WARNING: cannot write /results/events.out.tfevents.1: No space left on device: "
        "no more TensorBoard events in this run"
    ]
    assert full.calls == 2  # the first add, then the close when it was given up


def test_the_run_log_on_a_full_disk_goes_on_to_the_console(tmp_path, capsys):
    log = RunLog(tmp_path, 0, 0, echo=True)
    log("before")
    log._file.close()
    log._file = FullDisk()
    log("iteration 1")
    log("iteration 2")
    log.close()
    out, err = capsys.readouterr()
    assert out.splitlines() == ["before", "iteration 1", "iteration 2"]
    assert (
        err.count("WARNING: cannot write") == 1 and "the rest of this rank's log goes to the console" in err
    )
    assert (tmp_path / "nemo_log_globalrank-0_localrank-0.txt").read_text() == "before\n"


FAILING_WRITER_THREAD = """
import sys, threading
from pathlib import Path
from gptrain.train.results import Scalars

log_dir = Path(sys.argv[1])
scalars = Scalars(log_dir, enabled=True)
scalars.add({"lm loss": 1.0}, 1)
scalars._writer.flush()
events = next(log_dir.glob("events.out.tfevents.*"))
events.unlink()
events.mkdir()  # every later append fails (IsADirectoryError), in TensorBoard's own thread
scalars.add({"lm loss": 2.0}, 2)
scalars.close()
for thread in threading.enumerate():  # the writer thread has ended, its excepthook run
    if thread is not threading.current_thread():
        thread.join(timeout=10)
"""


def test_tensorboards_own_writer_thread_failing_prints_no_traceback(tmp_path):
    """A real SummaryWriter whose events file the file system refuses (a full disk): TensorBoard's
    writer thread dies of the OSError, and Python printed that thread's traceback into the job's log
    ahead of the one warning line. (In a subprocess: pytest replaces threading's excepthook.)"""
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-c", FAILING_WRITER_THREAD, str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr and "Exception in thread" not in done.stderr, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "no more TensorBoard events in this run" in lines[0], done.stderr
    assert "Is a directory" in lines[0]


def test_values_that_are_all_none_open_no_events_file(tmp_path):
    """A step whose values were all None (no validation yet, no loss scale) opened the writer, so a
    run that failed after it left an events file without events."""
    scalars = Scalars(tmp_path, enabled=True)
    scalars.add({"val loss": None}, 1)
    scalars.add_vs_samples({"val loss vs samples": None}, 8, 1)
    scalars.close()
    assert list(tmp_path.rglob("events.out.tfevents.*")) == []
    scalars = Scalars(tmp_path, enabled=True)
    scalars.add({"lm loss": 1.0, "val loss": None}, 1)
    scalars.close()
    assert len(list(tmp_path.rglob("events.out.tfevents.*"))) == 1
