"""`gptrain validate ARGS` as one rank of tests/validate/test_validate_runs.py on a CPU machine
taken for a GPU one, every rank on one node: the rate measurements and dcgmi diag are stand-ins
that write when they ran into GPTRAIN_TEST_TIMES_DIR; rank 1's matmul takes
GPTRAIN_TEST_MATMUL_S seconds (a GPU still timing its own while its node's dcgmi starts)."""

import json
import os
import sys
import time
import types
from pathlib import Path

import torch
from synced_start import wait_for_every_rank

from gptrain.cli import main
from gptrain.validate import gpus, nvml, runtime

RANK = int(os.environ["RANK"])


def note(name: str, start: float) -> None:
    path = Path(os.environ["GPTRAIN_TEST_TIMES_DIR"]) / f"{name}{RANK}.json"
    path.write_text(json.dumps([start, time.time()]))


def matmul(device, iters, warmup):
    start = time.time()
    if RANK == 1:
        time.sleep(float(os.environ["GPTRAIN_TEST_MATMUL_S"]))
    note("matmul", start)
    return 700.0


def dcgm(level, **kwargs):
    note("dcgm", time.time())
    return {"ran": True, "passed": True, "failures": [], "tail": ""}


if __name__ == "__main__":
    runtime.Context.is_gpu = property(lambda self: True)
    torch.cuda.get_device_properties = lambda index: types.SimpleNamespace(name="GPU", uuid=None)
    torch.cuda.empty_cache = lambda: None
    gpus.nvml_health = lambda uuid, index: ({}, [])
    gpus.matmul_tflops = matmul
    gpus.copy_GBps = lambda device, iters, warmup: 3000.0
    gpus.dcgm_diag = dcgm
    nvml.xid_events = lambda since_s=None: {"readable": True, "events": []}
    wait_for_every_rank()
    sys.exit(main(sys.argv[1:]))
