"""One rank of several `gptrain validate` runs in turn, in this one process (test_validate_runs.py):
a torch start-up per run costs seconds on a CPU VM.

Argument: a JSON list of {"argv": [...], "port": PORT, "envs": [one dict per rank], "log": PATH}.
Each run is `gptrain validate ARGV` as the CLI runs it, with this rank's variables of "envs" set
for it alone, on a port of its own, its stdout and stderr into PATH.rank<R> and its exit code into
PATH.rank<R>.code; every rank ends a run before any starts the next (as separate launches would).
"""

import json
import os
import sys
import time
import traceback
from pathlib import Path

from gptrain.cli import main


def run_one(argv: list[str], log: Path) -> int:
    """`gptrain validate ARGV` with stdout and stderr (file descriptors too) into `log`."""
    sys.stdout.flush(), sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    with open(log, "w") as handle:
        os.dup2(handle.fileno(), 1), os.dup2(handle.fileno(), 2)
        try:
            return main(["validate", *argv])
        except SystemExit as stop:  # argparse's usage errors, as the interpreter would exit
            return stop.code if isinstance(stop.code, int) else 1
        except BaseException:
            traceback.print_exc()
            return 1
        finally:
            sys.stdout.flush(), sys.stderr.flush()
            os.dup2(saved[0], 1), os.dup2(saved[1], 2)
            os.close(saved[0]), os.close(saved[1])


def wait_for_every_rank(log: str, world: int, timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while any(not Path(f"{log}.rank{r}.code").exists() for r in range(world)):
        if time.monotonic() > deadline:
            raise TimeoutError(f"not every rank ended the run logged to {log}")
        time.sleep(0.05)


def run_all(runs: list[dict]) -> None:
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    before = dict(os.environ)
    for run in runs:
        os.environ.update(run["envs"][rank], MASTER_PORT=str(run["port"]))
        code = run_one(run["argv"], Path(f"{run['log']}.rank{rank}"))
        os.environ.clear()
        os.environ.update(before)
        Path(f"{run['log']}.rank{rank}.code").write_text(f"{code}\n")
        wait_for_every_rank(run["log"], world)


if __name__ == "__main__":
    run_all(json.loads(sys.argv[1]))
