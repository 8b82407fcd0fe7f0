"""`gptrain validate ARGS` as one rank of tests/validate/test_validate_runs.py, where rank 1's
first pair of ranks inside its node raises the CUDA error of a GPU fallen off the bus (after the
node pairs ran)."""

import os
import sys

from synced_start import wait_for_every_rank

from gptrain.cli import main
from gptrain.validate import pairwise

run_round = pairwise.run_round


def lost_gpu_in_a_rank_pair(ctx, level, *args, **kwargs):
    if level == "rank":
        raise RuntimeError("CUDA error: unspecified launch failure")
    return run_round(ctx, level, *args, **kwargs)


if __name__ == "__main__":
    if os.environ["RANK"] == "1":
        pairwise.run_round = lost_gpu_in_a_rank_pair
    wait_for_every_rank()
    sys.exit(main(sys.argv[1:]))
