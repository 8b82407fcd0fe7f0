"""`gptrain validate ARGS` as one rank of tests/validate/test_validate_runs.py, started with the
others (synced_start.py)."""

import sys

from synced_start import wait_for_every_rank

import gptrain.validate.collectives  # noqa: F401  (torch, torch.distributed and the sweep)
from gptrain.cli import main

if __name__ == "__main__":
    wait_for_every_rank()
    sys.exit(main(sys.argv[1:]))
