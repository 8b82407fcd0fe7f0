"""Ranks of a tests/validate worker start `gptrain validate` together, once every one has imported
torch: with a short --timeout (also the process group's rendezvous wait) a rank still importing
on a loaded machine failed the start, which is not what those tests are about. The ranks meet in
GPTRAIN_TEST_START_DIR, one file each; without it, nothing to wait for."""

import os
import time
from pathlib import Path

import torch.distributed  # noqa: F401  (what a late rank would still be importing)


def wait_for_every_rank() -> None:
    if "GPTRAIN_TEST_START_DIR" not in os.environ:
        return
    meeting = Path(os.environ["GPTRAIN_TEST_START_DIR"])
    meeting.mkdir(parents=True, exist_ok=True)
    (meeting / f"rank{os.environ['RANK']}").touch()
    deadline = time.monotonic() + 300  # a safety net: the test's own wait ends it first
    while len(list(meeting.iterdir())) < int(os.environ["WORLD_SIZE"]) and time.monotonic() < deadline:
        time.sleep(0.05)
