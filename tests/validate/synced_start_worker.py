"""`gptrain validate ARGS` as one rank of tests/validate/test_validate_runs.py, started only once
every rank has imported torch: with --timeout 3 the process group's rendezvous waits 3 s for the
ranks, and on a loaded machine one still importing torch then fails the start (not what the test
is about). The ranks meet in GPTRAIN_TEST_START_DIR, one file each."""

import os
import sys
import time
from pathlib import Path

import gptrain.validate.collectives  # noqa: F401  (torch, torch.distributed and the sweep)
from gptrain.cli import main

if __name__ == "__main__":
    meeting = Path(os.environ["GPTRAIN_TEST_START_DIR"])
    meeting.mkdir(parents=True, exist_ok=True)
    (meeting / f"rank{os.environ['RANK']}").touch()
    deadline = time.monotonic() + 300  # a safety net: the test's own wait ends it first
    while len(list(meeting.iterdir())) < int(os.environ["WORLD_SIZE"]) and time.monotonic() < deadline:
        time.sleep(0.05)
    sys.exit(main(sys.argv[1:]))
