"""`gptrain validate ARGS` as one rank of tests/validate/test_validate_runs.py on a CPU machine
taken for a GPU one: each rank's GPU check returns a healthy record, rank 0's only after
GPTRAIN_TEST_GPU_CHECK_S seconds (the time `dcgmi diag` runs on its node)."""

import os
import sys
import time

from synced_start import wait_for_every_rank

from gptrain.cli import main
from gptrain.validate import gpus, runtime


def record(ctx, iters, warmup, dcgm_level, xid_since_s=None):
    if ctx.rank == 0:
        time.sleep(float(os.environ["GPTRAIN_TEST_GPU_CHECK_S"]))
    return {
        "rank": ctx.rank,
        "node": ctx.node,
        "cuda_index": 0,
        "name": "GPU",
        "nvml": {},
        "problems": [],
        "matmul_bf16_tflops": 700.0,
        "copy_GBps": 3000.0,
    }


if __name__ == "__main__":
    runtime.Context.is_gpu = property(lambda self: True)
    gpus.check_local_gpu = record
    wait_for_every_rank()
    sys.exit(main(sys.argv[1:]))
