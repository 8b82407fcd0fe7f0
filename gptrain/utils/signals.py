"""SIGTERM as an exception, so `with`/`finally` cleanup runs before the process ends; Ctrl-C
remembered, so the CLI can name it whatever error it turned into.

A Slurm time limit or `timeout` sends SIGTERM, whose default action ends the process at
once and leaves partial output (large temporary files) behind. Inside
`terminate_as_exception()` it raises `Terminated` instead; uncaught, that still ends the
process with status 128 + 15, as the signal would have.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from types import FrameType


class Terminated(SystemExit):
    """A termination signal arrived; unwinding runs the cleanup, then the process exits 128 + signum."""

    def __init__(self, signum: int) -> None:
        self.signum, self.status = signum, 128 + signum
        super().__init__(self.status)

    def __str__(self) -> str:
        return f"terminated by {signal.Signals(self.signum).name}"


@contextlib.contextmanager
def terminate_as_exception(signums: tuple[int, ...] = (signal.SIGTERM,)) -> Iterator[None]:
    """Raise `Terminated` on these signals inside the block; the previous handlers come back after.

    A signal the process ignores stays ignored, and off the main thread (where Python cannot
    install handlers) nothing changes. After the first signal further ones are ignored until
    the block ends, so a repeated SIGTERM does not cut the cleanup short.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {signum: signal.getsignal(signum) for signum in signums}
    active = [signum for signum, handler in previous.items() if handler is not signal.SIG_IGN]

    def handle(signum: int, frame: FrameType | None) -> None:
        del frame
        for other in active:
            signal.signal(other, signal.SIG_IGN)
        raise Terminated(signum)

    for signum in active:
        signal.signal(signum, handle)
    try:
        yield
    finally:
        for signum in active:
            handler = previous[signum]
            signal.signal(signum, handler if handler is not None else signal.SIG_DFL)


@dataclass
class Interrupts:
    """Whether Ctrl-C (SIGINT) arrived while `recording_interrupts()` was active."""

    seen: bool = False


@contextlib.contextmanager
def recording_interrupts() -> Iterator[Interrupts]:
    """SIGINT raises KeyboardInterrupt as Python's own handler does, and is remembered.

    Library code can swallow the KeyboardInterrupt: Ctrl-C while torch imports numpy leaves numpy
    half-initialised, and the import fails later with a RecursionError or "cannot load module more
    than once per process". Knowing the interrupt came first, the CLI reports it as one. A process
    that ignores SIGINT, or a handler of its own, is left as it is, and off the main thread nothing
    changes.
    """
    interrupts = Interrupts()
    on_main_thread = threading.current_thread() is threading.main_thread()
    if not on_main_thread or signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        yield interrupts
        return

    def handle(signum: int, frame: FrameType | None) -> None:
        interrupts.seen = True
        signal.default_int_handler(signum, frame)

    signal.signal(signal.SIGINT, handle)
    try:
        yield interrupts
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)
