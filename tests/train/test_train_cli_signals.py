"""`gptrain train` from the command line: one-line errors, max_time and signals -> checkpoint + 75."""

import os
import signal
import subprocess
import sys
import time
import types

import pytest
import torch
from train_e2e_helpers import MOCK, TINY

from gptrain.checkpoint.integrity import complete_steps
from gptrain.cli import main
from gptrain.errors import EXIT_REQUEUE
from gptrain.train.cli import split_preset
from gptrain.train.signals import INTERRUPT_HELD, StopRequest

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")


def test_unknown_key_is_one_line_error(tmp_path, capsys):
    code = main(["train", "gpt3/126m", "trainer.max_stepz=5", f"exp_manager.explicit_log_dir={tmp_path}"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and err.startswith("gptrain: error: ") and "max_stepz" in err and "\n" not in err


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_gpu_requested_without_cuda_is_one_line_error(tmp_path, capsys):
    code = main(
        [
            "train",
            "gpt3/126m",
            *TINY,
            *MOCK,
            "trainer.accelerator=gpu",
            f"exp_manager.explicit_log_dir={tmp_path}",
        ]
    )
    err = capsys.readouterr().err.strip()
    assert code == 2 and "trainer.accelerator=gpu" in err and "\n" not in err


def test_max_time_checkpoints_and_exits_for_requeue(tmp_path, capsys):
    args = [
        "train",
        "gpt3/126m",
        *TINY,
        *MOCK,
        "trainer.max_time=00:00:00:00.001",
        f"exp_manager.explicit_log_dir={tmp_path}",
    ]
    assert main(args) == EXIT_REQUEUE
    assert complete_steps(tmp_path / "checkpoints") == [1]
    assert "stopping at iteration 1: trainer.max_time reached" in capsys.readouterr().out


def test_stop_request_flags_signals_and_restores_handlers():
    previous = signal.getsignal(signal.SIGUSR1)
    stop = StopRequest().install()
    try:
        assert stop.reason() is None
        os.kill(os.getpid(), signal.SIGUSR1)
        assert stop.reason() == "received SIGUSR1"
    finally:
        stop.uninstall()
    assert signal.getsignal(signal.SIGUSR1) is previous
    assert (
        StopRequest(max_time_seconds=10.0, start=time.monotonic() - 11)
        .reason()
        .startswith("trainer.max_time")
    )


def test_after_the_run_a_stop_signal_acts_as_before_the_command():
    """Inside early_stops (the whole command), the run's StopRequest gave back early_stops' recorder
    when it uninstalled, so through the run's last shutdown a SIGTERM (scancel, torchrun) was
    recorded and dropped: a rank stuck waiting for its peers outlived it until SIGKILL."""
    from gptrain.train.signals import early_stops

    previous = signal.getsignal(signal.SIGTERM)
    with early_stops():
        stop = StopRequest().install()
        stop.uninstall()
        assert signal.getsignal(signal.SIGTERM) is previous  # not the recorder
        stop = StopRequest().install()
        stop.uninstall(keep_ignoring=True)  # a requeued run's shutdown ignores them, as before
        assert signal.getsignal(signal.SIGTERM) is signal.SIG_IGN
        signal.signal(signal.SIGTERM, previous)
    assert signal.getsignal(signal.SIGTERM) is previous


def test_preset_slot_holding_an_override_moves_back():
    assert split_preset("a.b=1", ["c=2"]) == (None, ["a.b=1", "c=2"])
    assert split_preset("gpt3/126m", ["c=2"]) == ("gpt3/126m", ["c=2"])


@pytest.mark.parametrize(
    ("signum", "to_group", "workers"),
    [(signal.SIGUSR1, False, 0), (signal.SIGTERM, True, 2)],
    ids=["sigusr1_to_process", "sigterm_to_group_with_loader_workers"],
)
def test_stop_signal_from_outside_checkpoints_and_exits_75(tmp_path, signum, to_group, workers):
    """A real process gets Slurm's warning signal mid-run: it saves at the next step boundary.

    Slurm and torchrun signal the whole process group, DataLoader workers included: they must
    leave the signal to the main process instead of dying under it."""
    overrides = [*TINY, *MOCK, "trainer.max_steps=100000", "trainer.val_check_interval=100000"]
    overrides += [
        f"exp_manager.explicit_log_dir={tmp_path}",
        "exp_manager.checkpoint_callback_params.every_n_train_steps=100000",
        f"model.data.num_workers={workers}",
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "gptrain", "train", "gpt3/126m", *overrides],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        start_new_session=True,
    )
    try:
        for line in proc.stdout:
            if " iteration        2/" in line:
                break
        if to_group:
            os.killpg(proc.pid, signum)
        else:
            proc.send_signal(signum)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == EXIT_REQUEUE, err
    assert f"received {signal.Signals(signum).name}" in out
    steps = complete_steps(tmp_path / "checkpoints")
    assert len(steps) == 1 and steps[0] >= 2


# Runs `gptrain train` in a process whose shutdown, after the run's stop line, gets SIGTERM twice:
# while the run closes its TensorBoard writer and again after the command has returned.
SIGTERM_DURING_SHUTDOWN = """
import os, signal, sys
from gptrain.cli import main
from gptrain.train import loop

close = loop.Scalars.close

def close_under_sigterm(self):
    os.kill(os.getpid(), signal.SIGTERM)
    close(self)

loop.Scalars.close = close_under_sigterm
code = main(sys.argv[1:])
os.kill(os.getpid(), signal.SIGTERM)
sys.exit(code)
"""


def test_a_sigterm_after_the_stop_checkpoint_still_exits_75(tmp_path):
    """Slurm SIGTERMs the whole step at the time limit, also after its --signal warning stopped the
    run: a single rank got it during its shutdown, with its checkpoint complete, and died of it (143),
    which the batch script does not requeue."""
    overrides = [*TINY, *MOCK, "trainer.max_time=00:00:00:00.001", f"exp_manager.explicit_log_dir={tmp_path}"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(
        [sys.executable, "-c", SIGTERM_DURING_SHUTDOWN, "train", "gpt3/126m", *overrides],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert proc.returncode == EXIT_REQUEUE, proc.stderr
    assert "stopping at iteration 1: trainer.max_time reached" in proc.stdout
    assert complete_steps(tmp_path / "checkpoints") == [1]


def test_a_stop_signal_during_start_up_trains_no_step_and_saves_nothing(tmp_path, capsys, monkeypatch):
    """SIGUSR1 while the checkpoint loads (start-up): the run stopped only after training a step and
    saving it; now it exits 75 before step 1, its checkpoint the one it loaded."""
    from gptrain.train import resuming

    args = ["train", "gpt3/126m", *TINY, *MOCK, f"exp_manager.explicit_log_dir={tmp_path}"]
    args += ["exp_manager.checkpoint_callback_params.every_n_train_steps=2"]
    assert main([*args, "trainer.max_steps=2"]) == 0
    assert complete_steps(tmp_path / "checkpoints") == [2]
    capsys.readouterr()
    resume = resuming.resume

    def signalled_while_loading(s, *a, **k):
        os.kill(os.getpid(), signal.SIGUSR1)
        return resume(s, *a, **k)

    monkeypatch.setattr(resuming, "resume", signalled_while_loading)
    assert main([*args, "trainer.max_steps=4"]) == EXIT_REQUEUE
    assert complete_steps(tmp_path / "checkpoints") == [2]
    out = capsys.readouterr().out
    assert (
        "stopping before the first step: received SIGUSR1; nothing trained since iteration 2's checkpoint"
        in out
    )
    assert " iteration        3/" not in out


# Runs `gptrain train` in a process that SIGINTs itself (only itself, as `kill -INT <pid>` does) while
# it receives a batch's shared memory from a DataLoader worker: in the handshake of that connection.
SIGINT_DURING_A_BATCH_RECEIVE = """
import os, signal, sys
import multiprocessing.connection as connection
from gptrain.cli import main

answer_challenge = connection.answer_challenge

def interrupted_while_answering(*args):
    connection.answer_challenge = answer_challenge
    os.kill(os.getpid(), signal.SIGINT)
    return answer_challenge(*args)

connection.answer_challenge = interrupted_while_answering
sys.exit(main(sys.argv[1:]))
"""


def test_a_sigint_to_the_main_process_mid_batch_is_one_line_and_130(tmp_path):
    """The worker handing the batch over waited on the connection the interrupted receive held, and
    printed a cut-off traceback from multiprocessing's resource_sharer when this process closed it on
    exit, after "gptrain: interrupted". A terminal's Ctrl-C interrupts the workers too, and was clean."""
    overrides = [*TINY, *MOCK, f"exp_manager.explicit_log_dir={tmp_path}", "model.data.num_workers=1"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(
        [sys.executable, "-c", SIGINT_DURING_A_BATCH_RECEIVE, "train", "gpt3/126m", *overrides],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert proc.returncode == 130, proc.stderr
    assert proc.stderr == INTERRUPT_HELD + "gptrain: interrupted\n"


def test_a_ctrl_c_while_tensorboard_takes_an_event_ends_the_run_at_the_end_of_its_step(
    tmp_path, capfd, monkeypatch
):
    """Ctrl-C raised KeyboardInterrupt wherever the run was: inside TensorBoard's writer, between its
    queue taking an event and waking the writer thread, the run's last flush waited out that thread's
    two-minute timer (about one `kill -INT` in 35). On one process the first Ctrl-C is now held to the
    end of its step: the event is written whole, and the run ends as Ctrl-C ends any command."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from gptrain.train.results import Scalars

    add_scalars, first = Scalars._add_scalars, {}

    def interrupted_while_adding(self, values, x):
        monkeypatch.setattr(Scalars, "_add_scalars", add_scalars)  # the first values only
        first.update(values=dict(values), x=x)
        os.kill(os.getpid(), signal.SIGINT)
        add_scalars(self, values, x)

    monkeypatch.setattr(Scalars, "_add_scalars", interrupted_while_adding)
    assert main(["train", "gpt3/126m", *TINY, *MOCK, f"exp_manager.explicit_log_dir={tmp_path}"]) == 130
    assert capfd.readouterr().err == INTERRUPT_HELD + "gptrain: interrupted\n"  # said when held
    events = EventAccumulator(str(tmp_path), size_guidance={"tensors": 0, "scalars": 0}).Reload()
    written = {tag: [e.step for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}
    written |= {tag: [e.step for e in events.Tensors(tag)] for tag in events.Tags()["tensors"]}
    assert first["x"] == 1 and first["values"]
    assert all(written.get(tag) == [1] for tag, value in first["values"].items() if value is not None)
    log = (tmp_path / "nemo_log_globalrank-0_localrank-0.txt").read_text()
    assert "interrupted (SIGINT) after iteration 1: nothing saved, the newest checkpoint is none" in log
    assert " iteration        2/" not in log and complete_steps(tmp_path / "checkpoints") == []


def test_a_held_ctrl_c_whose_notice_cannot_be_written_is_still_held():
    """`gptrain train ... 2>&1 | tee log` and Ctrl-C: the terminal's SIGINT ends tee at once, and the
    handler's notice met a pipe with no reader. Its BrokenPipeError came out of the handler wherever
    the main thread was (mid-step), what holding the Ctrl-C is for; the notice is dropped instead."""
    stop = StopRequest()
    read_end, write_end = os.pipe()
    os.close(read_end)  # tee has gone
    saved = os.dup(2)
    try:
        os.dup2(write_end, 2)
        with pytest.raises(KeyboardInterrupt), stop.holding_interrupts():
            os.kill(os.getpid(), signal.SIGINT)
            assert stop.interrupted  # the step went on past the handler
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(write_end)


def test_a_second_ctrl_c_ends_the_run_at_once(tmp_path, capfd, monkeypatch):
    """Held to the end of the step, Ctrl-C still has its way out: a second one acts where it lands."""
    from gptrain.train import step_loop

    record, reached = step_loop.record, []

    def interrupted_twice(s, result, *args):
        if s.state.step == 1:  # recording iteration 2
            os.kill(os.getpid(), signal.SIGINT)
            os.kill(os.getpid(), signal.SIGINT)
        reached.append(s.state.step + 1)
        record(s, result, *args)

    monkeypatch.setattr(step_loop, "record", interrupted_twice)
    assert main(["train", "gpt3/126m", *TINY, *MOCK, f"exp_manager.explicit_log_dir={tmp_path}"]) == 130
    assert capfd.readouterr().err == INTERRUPT_HELD + "gptrain: interrupted\n"
    assert reached == [1]
    assert "interrupted (SIGINT)" not in (tmp_path / "nemo_log_globalrank-0_localrank-0.txt").read_text()


# Runs `gptrain train` in its own process group, whose DataLoader worker sends Ctrl-C's SIGINT to the
# whole group (as a terminal does) while it reads the first batch the main process waits for. The
# worker takes SIGINT as a worker started afresh does (spawn; forkserver, Python 3.14's default), with
# Python's own handler, not the one a fork copied from the main process, unless its worker_init_fn
# chose to ignore it.
CTRL_C_TO_THE_GROUP_DURING_A_BATCH = """
import os, signal, sys
import torch.utils.data
from gptrain.cli import main
from gptrain.data import mock

getitem = mock.MockGPTDataset.__getitem__

def interrupting_the_group(self, index):
    if torch.utils.data.get_worker_info() is not None and not os.environ.get("INTERRUPTED"):
        os.environ["INTERRUPTED"] = "1"
        if signal.getsignal(signal.SIGINT) is not signal.SIG_IGN:
            signal.signal(signal.SIGINT, signal.default_int_handler)
        os.killpg(os.getpgid(0), signal.SIGINT)
    return getitem(self, index)

mock.MockGPTDataset.__getitem__ = interrupting_the_group
sys.exit(main(sys.argv[1:]))
"""


def test_a_terminals_ctrl_c_during_a_batch_ends_the_run_after_that_step(tmp_path):
    """A terminal's Ctrl-C reaches the DataLoader workers too: one that died of it failed the batch
    the main process, holding its own Ctrl-C to the end of the step, was waiting for."""
    overrides = [*TINY, *MOCK, f"exp_manager.explicit_log_dir={tmp_path}", "model.data.num_workers=1"]
    proc = subprocess.run(
        [sys.executable, "-c", CTRL_C_TO_THE_GROUP_DURING_A_BATCH, "train", "gpt3/126m", *overrides],
        capture_output=True,
        text=True,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        timeout=120,
        start_new_session=True,
    )
    assert proc.returncode == 130, proc.stderr
    assert proc.stderr == INTERRUPT_HELD + "gptrain: interrupted\n"
    assert "interrupted (SIGINT) after iteration 1: nothing saved" in proc.stdout


def test_max_time_counts_from_the_commands_start_not_from_the_handlers(tmp_path, capsys, monkeypatch):
    """Slurm's time limit counts the start-up before the run's StopRequest (torch's import, the
    rendezvous, the run directory's claim): an hour of it, here on a clock moved on while the run
    directory is claimed, is spent of a half-hour trainer.max_time, so the run stops after its first
    step. Counted from the handlers' install, it trained on to max_steps, into the time limit."""
    from gptrain.train import loop, signals

    hour = [0.0]
    real_clock = time.monotonic
    clock = types.SimpleNamespace(monotonic=lambda: real_clock() + hour[0])
    monkeypatch.setattr(signals, "time", clock)  # the stop's clock only: the hang watchdog keeps its own
    claim = loop.claim_run_directory

    def slow_claim(*args, **kwargs):
        hour[0] = 3600.0
        return claim(*args, **kwargs)

    monkeypatch.setattr(loop, "claim_run_directory", slow_claim)
    args = ["train", "gpt3/126m", *TINY, *MOCK, "trainer.max_time=00:00:30:00"]
    assert main([*args, f"exp_manager.explicit_log_dir={tmp_path}"]) == EXIT_REQUEUE
    assert complete_steps(tmp_path / "checkpoints") == [1]
    assert "stopping at iteration 1: trainer.max_time reached after 1800 s" in capsys.readouterr().out
