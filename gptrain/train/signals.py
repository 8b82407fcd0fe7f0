"""Stop requests: SIGTERM/SIGUSR1 (Slurm's warning signal) and trainer.max_time.

Handlers only set a flag; the loop checks it at the next step boundary, saves a
checkpoint and exits with EXIT_REQUEUE, so no state is ever saved mid-step. A signal
during start-up (model build, data indices, checkpoint load) stops the run before its
first step, with nothing to save (gptrain.train.stopping.stop_before_training).

Ctrl-C (SIGINT) ends a run as it ends any command (exit 130, nothing saved); on one process it is
held to the end of the step it lands in (StopRequest.holding_interrupts).
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any

STOP_SIGNALS = (signal.SIGTERM, signal.SIGUSR1)
INTERRUPT_HELD = "gptrain: Ctrl-C: ending the run after this step; Ctrl-C again to end it now\n"
# Stop signals that came before the run's StopRequest was installed (see early_stops).
_early: list[str] = []
# The handlers early_stops replaced: what a StopRequest that found _remember installed gives back.
_outer: dict[int, Any] = {}
# When early_stops was entered (the start of `gptrain train` or `gptrain megatron`, before torch's
# import): what trainer.max_time (--exit-duration-in-mins) counts from.
_command_start: list[float] = []


def _remember(signum: int, frame: FrameType | None) -> None:
    del frame
    _early.append(signal.Signals(signum).name)


@contextmanager
def early_stops() -> Iterator[None]:
    """From the start of `gptrain train` (and `gptrain megatron`): a stop signal during its imports (torch takes seconds),
    config load and process-group start-up is remembered for the StopRequest, which stops before
    the first step; under the default action it killed the rank (exit 138/143), which the batch
    script does not requeue. The old handlers come back at the end, unless the run has set the
    stop signals to be ignored through its shutdown (StopRequest.uninstall(keep_ignoring))."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    _command_start[:] = [time.monotonic()]
    previous = {signum: signal.signal(signum, _remember) for signum in STOP_SIGNALS}
    _outer.update(previous)
    try:
        yield
    finally:
        _early.clear()
        _outer.clear()
        _command_start.clear()
        for signum, handler in previous.items():
            if signal.getsignal(signum) is _remember:
                signal.signal(signum, handler)


class StopRequest:
    """Collects the reason to stop early, if any.

    trainer.max_time counts from `start`: by default the start of the command (command_start), as
    Megatron's --exit-duration-in-mins counts from its process's start (_TRAIN_START_TIME, set when
    its training.py is imported, before the heavy imports; the earliest across ranks, a MIN). Here
    each rank counts from its own start and the ranks agree the stop, so the earliest one's clock
    stops the run as well. Slurm's time limit counts the torch import, the rendezvous, the run
    directory's claim before the handlers are installed; a budget counted from there let a slow
    start-up run into the time limit without its checkpoint. Called from Python outside
    early_stops, it counts from here."""

    def __init__(self, max_time_seconds: float | None = None, start: float | None = None) -> None:
        self.start = start if start is not None else command_start()
        self.max_time_seconds = max_time_seconds
        self.signal_name: str | None = None
        self.interrupted = False  # a Ctrl-C held by holding_interrupts
        self._previous: dict[int, Any] = {}
        self._ignored: dict[int, Any] = {}  # the handlers uninstall(keep_ignoring=True) set aside

    def install(self) -> StopRequest:
        """Install the handlers; `uninstall` restores the old ones. Off the main thread
        (where Python cannot take signals) only max_time applies."""
        if threading.current_thread() is not threading.main_thread():
            return self
        for signum in STOP_SIGNALS:
            self._previous[signum] = signal.signal(signum, self._handle)
        if _early:  # signalled before this was installed (early_stops)
            self.signal_name = _early[-1]
            _early.clear()
        return self

    def uninstall(self, keep_ignoring: bool = False) -> None:
        """Restore the old handlers; `keep_ignoring`: ignore the stop signals from now on instead.

        A run stopped for a requeue has its checkpoint and exits EXIT_REQUEUE; its ranks do not all
        exit at once, and `srun --kill-on-bad-exit` counts the first one's 75 as a bad exit and
        SIGTERMs the others; a single rank stopped by Slurm's warning signal gets the time limit's
        SIGTERM while it shuts down. Under the default handler it would die of it, and the step's
        status (143) would tell the batch script not to requeue a job that saved its state. The
        signals stay ignored until the process exits (its command is over), or until
        `stop_ignoring` gives a caller that goes on its handlers back."""
        for signum, handler in self._previous.items():
            if handler is _remember:  # early_stops' recorder: after the run a stop signal acts again
                handler = _outer.get(signum, signal.SIG_DFL)
            if keep_ignoring:
                self._ignored[signum] = handler
            signal.signal(signum, signal.SIG_IGN if keep_ignoring else handler)
        self._previous.clear()

    def stop_ignoring(self) -> None:
        """The handlers from before the run again, after `uninstall(keep_ignoring=True)`: for a caller
        that goes on after the run (a notebook, a test process), where an ignored SIGTERM would
        outlive the shutdown it was for. Left ignored where someone set them since."""
        for signum, handler in self._ignored.items():
            if signal.getsignal(signum) is signal.SIG_IGN:
                signal.signal(signum, handler)
        self._ignored.clear()

    @contextmanager
    def holding_interrupts(self, enabled: bool = True) -> Iterator[None]:
        """Inside, a first Ctrl-C (SIGINT) only sets `interrupted`, for the step loop to end the run at
        the end of its step, or the block's end at the latest; a second one acts at once.

        Raised wherever the main thread was, KeyboardInterrupt could land inside TensorBoard's writer,
        between its queue taking an event and waking the writer thread: the run's last flush then
        waited out that thread's two-minute timer. Not `enabled` (several ranks, which must stop at
        the same step), off the main thread, or with SIGINT ignored or not Python's, nothing changes."""
        on_main_thread = threading.current_thread() is threading.main_thread()
        outer = signal.getsignal(signal.SIGINT) if on_main_thread else None
        if not enabled or outer is None or outer is signal.SIG_IGN:
            yield
            return

        def hold(signum: int, frame: FrameType | None) -> None:
            del signum, frame
            self.interrupted = True
            signal.signal(signal.SIGINT, outer)  # a second Ctrl-C: at once
            # said at once (a validation or a save may come before the step's end): a silent first
            # Ctrl-C reads as ignored. os.write, not print: the main thread may be inside a write
            # to stderr, and a buffered write re-entered from a handler raises.
            with contextlib.suppress(OSError):  # a notice only: stderr may be a pipe whose tee died
                os.write(2, INTERRUPT_HELD.encode())  # of the same Ctrl-C; raising here is mid-step

        signal.signal(signal.SIGINT, hold)
        try:
            yield
        finally:
            if signal.getsignal(signal.SIGINT) is hold:
                signal.signal(signal.SIGINT, outer)
        if self.interrupted:  # held through the work after the last step (final save, test split)
            raise KeyboardInterrupt

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        del frame
        self.signal_name = signal.Signals(signum).name

    def signalled(self) -> str | None:
        """Why to stop before the first step: a signal only. trainer.max_time is a budget of steps: one
        spent in start-up still trains a step, or a start-up longer than it would requeue for ever."""
        return None if self.signal_name is None else f"received {self.signal_name}"

    def reason(self) -> str | None:
        """Why to stop now ('SIGUSR1', 'max_time 00:00:10:00 reached'), or None."""
        if self.signal_name is not None:
            return f"received {self.signal_name}"
        if self.max_time_seconds is not None and time.monotonic() - self.start >= self.max_time_seconds:
            return f"trainer.max_time reached after {self.max_time_seconds:.0f} s"
        return None


def command_start() -> float:
    """time.monotonic() at the start of `gptrain train`/`gptrain megatron` (early_stops), or now: the
    one start trainer.max_time and --exit-duration-in-mins count from."""
    return _command_start[0] if _command_start else time.monotonic()


def ignore_stop_signals(worker_id: int) -> None:
    """DataLoader worker_init_fn: stop signals, and Ctrl-C, are the main process's to act on.

    Slurm signals every process of a job step (scancel, preemption, `--signal`) and torchrun
    its whole process group. torch's workers die on a SIGTERM that is not from their parent,
    which would crash the step the main process is about to checkpoint. A terminal's Ctrl-C
    reaches the workers too, and one that ended a worker failed the batch a run holding it
    (StopRequest.holding_interrupts) was receiving. Ignored here, a worker still ends when the
    main process shuts the loader down or exits (torch watches the parent).
    """
    del worker_id
    for signum in (*STOP_SIGNALS, signal.SIGINT):
        signal.signal(signum, signal.SIG_IGN)
