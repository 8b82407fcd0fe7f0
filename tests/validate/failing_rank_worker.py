"""`gptrain validate ARGS` as one rank of tests/validate/test_validate_runs.py, where rank 1's
pairwise check raises the CUDA error of a GPU fallen off the bus (its peers then wait in a
collective it never joins)."""

import os
import sys

from gptrain.cli import main
from gptrain.validate import main as validate_main


def lost_gpu(*_):
    raise RuntimeError("CUDA error: unspecified launch failure\nCUDA kernel errors might be reported later")


if __name__ == "__main__":
    if os.environ["RANK"] == "1":
        validate_main.CHECKS["pairwise"] = lost_gpu
    sys.exit(main(sys.argv[1:]))
