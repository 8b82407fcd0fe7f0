"""torchrun that ends with its workers' own exit code (2, 75, 76), and passes stop signals on.

torchrun ends with 1 whatever its workers exited with, so a local launch (`cluster_type=local`)
whose ranks stopped at a checkpoint to be requeued, or after a hang, reported a failure, and a
wrapper that relaunches on 75 stopped instead. The code of the first worker to exit is passed
on when it is one of gptrain's own (PASSED_ON); anything else is 1, as torchrun says. Ctrl-C
ends it with the shell's 130 and one line, not torchrun's traceback.

On SIGTERM (or SIGHUP) torchrun itself stops: it signals its workers and kills them 30 s later,
whether or not they have written the checkpoint they save on that signal; SIGUSR1 (Slurm's
warning signal) it does not handle at all, so it died of it and left its workers training. Here
all three are passed to the workers and torchrun goes on watching them, so they save and exit 75.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
from pathlib import Path

from gptrain.errors import EXIT_HUNG, EXIT_REQUEUE

# Signals torchrun handles itself (its TORCHELASTIC_SIGNALS_TO_HANDLE); SIGTERM, SIGHUP, SIGUSR1 are ours.
TORCHRUN_SIGNALS = "SIGINT,SIGQUIT"
# Worker exit codes that mean something to whoever launched the job: a usage or config error (2,
# not worth a retry), a checkpoint saved for a requeue (75), a hang (76). Others are failures (1).
PASSED_ON = (2, EXIT_REQUEUE, EXIT_HUNG)


def worker_pids(parent: int | str = "self") -> list[int]:
    """The children of `parent` (this process: torchrun's workers), from /proc (empty where there
    is none)."""
    pids: list[int] = []
    with contextlib.suppress(OSError):
        for task in Path(f"/proc/{parent}/task").iterdir():
            with contextlib.suppress(OSError, ValueError):
                pids += [int(pid) for pid in (task / "children").read_text().split()]
    return pids


def pass_to_workers(signum: int, frame: object) -> None:
    """The stop request goes to the ranks, which checkpoint and exit 75 (gptrain.train.signals): as
    SIGUSR1 when that came (their stop line names it), else SIGTERM (they do not handle SIGHUP)."""
    del frame
    passed = signal.SIGUSR1 if signum == signal.SIGUSR1 else signal.SIGTERM
    for pid in worker_pids():
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, passed)


def main(argv: list[str] | None = None) -> int:
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig
    from torch.distributed.run import main as torchrun_main

    argv = list(sys.argv[1:] if argv is None else argv)
    if "signals_to_handle" in LaunchConfig.__dataclass_fields__:  # its flag sets the variable below
        if not any(arg.startswith(("--signals-to-handle", "--signals_to_handle")) for arg in argv):
            argv = [f"--signals-to-handle={TORCHRUN_SIGNALS}", *argv]
    else:
        os.environ.setdefault("TORCHELASTIC_SIGNALS_TO_HANDLE", TORCHRUN_SIGNALS)
    for signum in (signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1):
        signal.signal(signum, pass_to_workers)
    try:
        torchrun_main(argv)
    except ChildFailedError as error:
        _, first = error.get_first_failure()  # the others are stopped after it: their codes follow from it
        return first.exitcode if first.exitcode in PASSED_ON else 1
    except SignalException as error:  # Ctrl-C / SIGQUIT: torchrun stopped the workers; the shell's code
        print(f"gptrain: stopped by {signal.Signals(error.sigval).name}", file=sys.stderr)
        return 128 + int(error.sigval)
    except KeyboardInterrupt:
        return 128 + signal.SIGINT
    return 0


if __name__ == "__main__":
    sys.exit(main())
