"""`gptrain validate ARGS` as one rank of tests/validate/test_validate_runs.py, where rank 1's
third measurement of the collectives sweep raises the CUDA error of a GPU fallen off the bus."""

import os
import sys

from synced_start import wait_for_every_rank

from gptrain.cli import main
from gptrain.validate import collectives

measured = 0
measure = collectives.measure


def lost_gpu_on_the_third(*args, **kwargs):
    global measured
    measured += 1
    if measured == 3:
        raise RuntimeError("CUDA error: unspecified launch failure")
    return measure(*args, **kwargs)


if __name__ == "__main__":
    if os.environ["RANK"] == "1":
        collectives.measure = lost_gpu_on_the_third
    wait_for_every_rank()
    sys.exit(main(sys.argv[1:]))
